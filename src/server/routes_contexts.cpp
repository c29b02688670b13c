// /v1/contexts: a context is prefilled once, compressed by a method (or kept full), saved
// as a cache file in the store and answered from by later requests (their `context` field).
#include "kvlab/press.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"
#include "server/openai.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

struct ContextRequest {
    std::string text, name, method = "none", preset;
    std::vector<ChatMessage> before;
    ParamMap params;
    bool has_budget = false;
    Budget budget;
};

ContextRequest parse_context_request(const nlohmann::json & b) {
    ContextRequest r;
    if (b.contains("messages")) {
        if (b.contains("text")) throw ApiError(400, "give 'text' or 'messages', not both", "messages");
        std::vector<ChatMessage> m = parse_messages(b["messages"], "messages");
        if (m.back().role != "user")
            throw ApiError(400, "the last message is the context: it must be a user message", "messages");
        r.text = m.back().content;
        m.pop_back();
        r.before = m;
    } else if (b.contains("text") && b["text"].is_string()) {
        r.text = b["text"];
        if (b.contains("system") && !b["system"].is_null()) {
            if (!b["system"].is_string()) throw ApiError(400, "'system' must be a string", "system");
            r.before.push_back({"system", b["system"]});
        }
    } else {
        throw ApiError(400, "give the context as 'text' (a string) or 'messages'", "text");
    }
    if (r.text.empty()) throw ApiError(400, "the context is empty", "text");
    for (const char * key : {"name", "method", "preset"})
        if (b.contains(key) && !b[key].is_null() && !b[key].is_string())
            throw ApiError(400, std::string("'") + key + "' must be a string", key);
    r.name = b.value("name", "");
    r.method = b.contains("method") && b["method"].is_string() ? b["method"].get<std::string>() : "none";
    r.preset = b.contains("preset") && b["preset"].is_string() ? b["preset"].get<std::string>() : "";
    if (!r.preset.empty() && r.preset != "kvpress") throw ApiError(400, "'preset' can only be \"kvpress\"", "preset");
    const bool ratio = b.contains("ratio") && !b["ratio"].is_null(),
               tokens = b.contains("budget") && !b["budget"].is_null();
    if (ratio && tokens) throw ApiError(400, "give 'ratio' or 'budget', not both", "budget");
    if (ratio) {
        if (!b["ratio"].is_number() || b["ratio"].get<double>() < 0.0 || b["ratio"].get<double>() >= 1.0)
            throw ApiError(400, "'ratio' must be a number in [0, 1)", "ratio");
        r.budget = Budget::from_ratio(b["ratio"].get<double>());
        r.has_budget = true;
    }
    if (tokens) {
        if (!b["budget"].is_number_integer() || b["budget"].get<int64_t>() < 1)
            throw ApiError(400, "'budget' must be a positive integer (tokens kept per layer)", "budget");
        r.budget = Budget::from_tokens(b["budget"].get<int64_t>());
        r.has_budget = true;
    }
    if (r.method != "none" && !r.has_budget)
        throw ApiError(400, "method " + r.method + " needs 'ratio' or 'budget'", "ratio");
    if (r.method == "none" && r.has_budget) throw ApiError(400, "'ratio' and 'budget' need a 'method'", "method");
    if (b.contains("params") && !b["params"].is_null()) {
        if (!b["params"].is_object()) throw ApiError(400, "'params' must be an object", "params");
        for (const auto & [k, v] : b["params"].items()) {
            if (v.is_string())
                r.params[k] = v.get<std::string>();
            else if (v.is_number() || v.is_boolean())
                r.params[k] = v.dump();
            else
                throw ApiError(400, "'params." + k + "' must be a string, number or boolean", "params");
        }
    }
    return r;
}

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
