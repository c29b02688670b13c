// /v1/contexts: a context is prefilled once, compressed by a method (or kept full), saved
// as a cache file in the store and answered from by later requests (their `context` field).
#include "kvlab/press.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"
#include "server/context_request.h"
#include "server/openai.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

void create_context(ServerState & s, const httplib::Request & req, httplib::Response & res) {
    const ContextRequest r = parse_context_request(parse_json_body(req.body));
    std::vector<MethodRequest> methods;
    if (r.method != "none") methods.push_back({r.method, apply_preset(r.preset, r.method, r.params)});
    const std::vector<int32_t> tokens = s.tok.context_chat(r.before, r.text, {{"user", ""}}).context;
    const int64_t n_ctx = s.model.hparams().n_ctx_train;
    if (int64_t(tokens.size()) >= n_ctx)
        throw ApiError(400,
                       "the context has " + std::to_string(tokens.size()) + " tokens; the model's context is " +
                           std::to_string(n_ctx) + " (and questions need room after it)",
                       "text", "context_length_exceeded");
    const auto lease = s.slots->acquire();
    ContextSession session(lease->engine(), methods, SessionOptions{0, 0, &s.tok});
    session.prefill(tokens);
    PreparedCache p = methods.empty() ? session.full() : session.compress(0, r.budget);
    const HParams & hp = s.model.hparams();
    const int64_t rows_full = int64_t(tokens.size()) * hp.n_layer * hp.n_head_kv;
    nlohmann::json object = {
        {"name", r.name},
        {"model", s.opts.model_id},
        {"method", p.method},
        {"params", methods.empty() ? nlohmann::json::object() : session.press(0).params()},
        {"budget", !r.has_budget          ? nlohmann::json()
                   : r.budget.tokens >= 0 ? nlohmann::json{{"tokens", r.budget.tokens}}
                                          : nlohmann::json{{"ratio", r.budget.ratio}}},
        {"preset", r.preset},
        {"before", before_json(r.before)},
        {"tokens", tokens.size()},
        {"rows_kept", p.cache.total_rows()},
        {"rows_full", rows_full},
        {"kv_bytes", p.cache.used_bytes()},
        {"kv_bytes_full", uint64_t(rows_full) * p.cache.row_bytes()},
        {"achieved_ratio", achieved_ratio(p.cache, int64_t(tokens.size()))},
        {"timings",
         {{"prefill_s", session.prefill_stats().seconds},
          {"prefill_tokens_per_s", session.prefill_stats().tokens_per_second()},
          {"compress_s", p.stats.seconds()}}},
    };
    const double t0 = now_seconds();
    nlohmann::json out = s.store->add(std::move(p.cache), CacheFileContent{r.text, tokens, object}, object);
    out["timings"]["save_s"] = now_seconds() - t0;
    send_json(res, 201, out);
}

}  // namespace

void add_context_routes(ServerState & s) {
    s.http.Post("/v1/contexts", [&s](const httplib::Request & req, httplib::Response & res) {
        guarded(res, [&] { create_context(s, req, res); });
    });
    s.http.Get("/v1/contexts",
               [&s](const httplib::Request &, httplib::Response & res) { send_json(res, 200, s.store->list()); });
    s.http.Get(R"(/v1/contexts/([^/]+))", [&s](const httplib::Request & req, httplib::Response & res) {
        const std::string id = req.matches[1];
        const nlohmann::json j = valid_context_id(id) ? s.store->describe(id) : nlohmann::json();
        if (j.is_null()) return send_error(res, ApiError(404, "no context '" + id + "'", "id", "context_not_found"));
        send_json(res, 200, j);
    });
    s.http.Delete(R"(/v1/contexts/([^/]+))", [&s](const httplib::Request & req, httplib::Response & res) {
        const std::string id = req.matches[1];
        if (!valid_context_id(id) || !s.store->remove(id))
            return send_error(res, ApiError(404, "no context '" + id + "'", "id", "context_not_found"));
        send_json(res, 200, {{"id", id}, {"object", "context"}, {"deleted", true}});
    });
}

}  // namespace kvlab::server
