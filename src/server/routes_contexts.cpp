// /v1/contexts: a context is prefilled once, compressed by a method (or kept full), saved
// as a cache file in the store and answered from by later requests (their `context` field).
#include <optional>

#include "kvlab/compress_flow.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "server/context_key.h"
#include "server/context_request.h"
#include "server/openai.h"
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

void create_context(ServerState & s, const nlohmann::json & body, httplib::Response & res) {
    const ContextRequest r = parse_context_request(body, s.opts.engine.cache_types);
    size_t bytes = r.text.size();
    for (const ChatMessage & m : r.before) bytes += m.content.size();
    check_prompt_bytes(s, bytes, "text");
    ContextJob job;
    job.text = r.text;
    job.before = r.before;
    job.method = r.method;
    job.preset = r.preset;
    if (r.method != "none") job.params = apply_preset(r.preset, r.method, r.params);
    if (r.has_budget) job.budget = r.budget;
    job.cache_types = r.cache_types;
    // the same content is the same context: made once, by one replica, then reused
    const std::string id = context_key(s.model.file_sha256(), job, r.cache_types.value_or(s.opts.engine.cache_types));
    const auto reuse = [&](nlohmann::json existing) {
        s.store->count_making(true);
        existing["reused"] = true;
        send_json(res, 200, existing);
    };
    nlohmann::json existing = s.store->existing(id);
    if (!existing.is_null()) return reuse(std::move(existing));
    const ContextStore::Making making = s.store->making(id);
    existing = s.store->existing(id);  // made while this request waited for the maker?
    if (!existing.is_null()) return reuse(std::move(existing));
    s.store->count_making(false);
    const auto lease = s.slots->acquire();  // tokenizing is work a slot bounds too
    try {
        job.tokens = context_tokens(s.tok, s.model, job);
    } catch (const Error & e) {
        throw ApiError(400, e.what(), "text", "context_length_exceeded");
    }
    // with batching, on the decoding loop's thread and engine (BatchScheduler::run: one OpenMP
    // team, every thread), the steps waiting meanwhile
    std::optional<MadeContext> made;
    if (s.batch)
        s.batch->run([&] { made.emplace(make_context(s.batch->engine(), s.tok, job)); });
    else
        made.emplace(make_context(lease->engine(), s.tok, job));
    MadeContext & m = *made;
    nlohmann::json object = {{"name", r.name}, {"model", s.opts.model_id}};
    object.update(m.info);
    const double t0 = now_seconds();
    nlohmann::json out =
        s.store->add(id, std::move(m.prepared.cache), CacheFileContent{r.text, m.tokens, object}, object);
    out["timings"]["save_s"] = now_seconds() - t0;
    out["reused"] = false;
    send_json(res, 201, out);
}

const RouteRegistrar reg(
    {{"POST", "/v1/contexts"}, {"GET", "/v1/contexts"}, {"GET", "/v1/contexts/{id}"}, {"DELETE", "/v1/contexts/{id}"}},
    [](ServerState & s) {
        post_json(s, "/v1/contexts",
                  [&s](const httplib::Request &, const nlohmann::json & body, httplib::Response & res) {
                      create_context(s, body, res);
                  });
        s.http.Get("/v1/contexts",
                   [&s](const httplib::Request &, httplib::Response & res) { send_json(res, 200, s.store->list()); });
        s.http.Get(R"(/v1/contexts/([^/]+))", [&s](const httplib::Request & req, httplib::Response & res) {
            const std::string id = req.matches[1];
            const nlohmann::json j = valid_context_id(id) ? s.store->describe(id) : nlohmann::json();
            if (j.is_null()) return send_error(res, unknown_context(id, "id"));
            send_json(res, 200, j);
        });
        s.http.Delete(R"(/v1/contexts/([^/]+))", [&s](const httplib::Request & req, httplib::Response & res) {
            const std::string id = req.matches[1];
            if (!valid_context_id(id) || !s.store->remove(id)) return send_error(res, unknown_context(id, "id"));
            send_json(res, 200, {{"id", id}, {"object", "context"}, {"deleted", true}});
        });
    });

}  // namespace

}  // namespace kvlab::server
