#include <openssl/crypto.h>

#include <cstdio>
#include <ctime>

#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

#include "web_page.inc"  // k_web_page: data/web/index.html, embedded by CMake

// The endpoint a metric counts a request under (ids folded away).
std::string endpoint_of(const std::string & path) {
    if (path.rfind("/v1/contexts/", 0) == 0) return "/v1/contexts/{id}";
    for (const char * p :
         {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/contexts", "/health", "/metrics", "/"})
        if (path == p) return p;
    return "other";
}

// Constant time in the key's content: both sides hashed, the digests compared with CRYPTO_memcmp.
bool key_matches(const std::string & given, const std::string & key) {
    const std::string a = sha256_hex(given.data(), given.size()), b = sha256_hex(key.data(), key.size());
    return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

void send_json(httplib::Response & res, int status, const nlohmann::json & body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response & res, const ApiError & e) {
    send_json(res, e.status, e.body());
}

void guarded(httplib::Response & res, const std::function<void()> & fn) {
    try {
        fn();
    } catch (const ApiError & e) {
        send_error(res, e);
    } catch (const MemoryError & e) {
        send_error(res, ApiError(507, e.what(), "", "insufficient_memory"));
    } catch (const Error & e) {
        send_error(res, ApiError(400, e.what()));
    } catch (const std::bad_alloc &) {
        send_error(res, ApiError(507, "out of memory"));
    } catch (const std::exception & e) {
        send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
}

ServerState::ServerState(const Model & m, const Tokenizer & t, ServerOptions o) : model(m), tok(t), opts(std::move(o)) {
    fingerprint = "kvlab-" + kvlab_version() + "-" + kvlab_git_commit();
}

Server::Server(const Model & model, const Tokenizer & tok, ServerOptions opts)
    : s_(std::make_unique<ServerState>(model, tok, std::move(opts))) {
    ServerState & s = *s_;
    const ServerOptions & o = s.opts;
    if (o.parallel < 1) throw Error("serve", "--parallel must be at least 1");
    if (o.queue < 0) throw Error("serve", "--queue cannot be negative");
    EngineOptions eo = o.engine;
    eo.n_threads = std::max(1, o.threads / o.parallel);
    s.slots = std::make_unique<Slots>(model, o.parallel, o.queue, o.queue_timeout_s, eo);
    s.store = std::make_unique<ContextStore>(model, o.store_dir, o.kv_budget);

    httplib::Server & http = s.http;
    const int n_workers = o.parallel + o.queue + 8;  // connections handled at once
    http.new_task_queue = [n_workers] { return new httplib::ThreadPool(size_t(n_workers)); };
    http.set_payload_max_length(o.max_body);
    http.set_read_timeout(o.io_timeout_s, 0);
    http.set_write_timeout(o.io_timeout_s, 0);
    http.set_keep_alive_max_count(1000);

    http.set_pre_routing_handler([&s](const httplib::Request & req, httplib::Response & res) {
        if (s.opts.api_key.empty() || req.path == "/health" || req.path == "/")
            return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        const std::string prefix = "Bearer ";
        const std::string given = auth.rfind(prefix, 0) == 0 ? auth.substr(prefix.size()) : std::string();
        if (!given.empty() && key_matches(given, s.opts.api_key)) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res,
                   ApiError(401, auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'" : "invalid API key",
                            "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler([](const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;
        const int st = res.status;
        const std::string msg = st == 404   ? "no route " + req.method + " " + req.path
                                : st == 413 ? "the request body is larger than the server's limit"
                                : st == 405 ? "method not allowed"
                                            : "HTTP " + std::to_string(st);
        send_error(res, ApiError(st, msg));
        res.status = st;
    });
    http.set_exception_handler([](const httplib::Request &, httplib::Response & res, std::exception_ptr ep) {
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception & e) {
            send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
        } catch (...) {
            send_error(res, ApiError(500, "internal error"));
        }
    });
    http.set_logger([&s](const httplib::Request & req, const httplib::Response & res) {
        s.metrics.request(endpoint_of(req.path), res.status);
    });

    http.Get("/", [](const httplib::Request &, httplib::Response & res) {
        res.set_content(k_web_page, "text/html; charset=utf-8");
    });
    http.Get("/health", [&s](const httplib::Request &, httplib::Response & res) {
        send_json(res, 200,
                  {{"status", "ok"},
                   {"slots_idle", s.slots->size() - s.slots->busy()},
                   {"slots_processing", s.slots->busy()}});
    });
    http.Get("/v1/models", [&s](const httplib::Request &, httplib::Response & res) {
        const nlohmann::json m = {{"id", s.opts.model_id},
                                  {"object", "model"},
                                  {"created", int64_t(std::time(nullptr))},
                                  {"owned_by", "kvlab"},
                                  {"meta",
                                   {{"n_ctx_train", s.model.hparams().n_ctx_train},
                                    {"n_vocab", s.model.hparams().n_vocab},
                                    {"arch", s.model.hparams().arch}}}};
        send_json(res, 200, {{"object", "list"}, {"data", {m}}});
    });
    http.Get("/metrics", [&s](const httplib::Request &, httplib::Response & res) {
        const MemInfo mi = mem_info();
        res.set_content(
            s.metrics.render({
                {"kvlab_kv_resident_bytes", "Bytes of stored contexts' KV rows resident in memory.",
                 double(s.store->resident_bytes())},
                {"kvlab_kv_budget_bytes", "The --kv-budget the resident rows stay under.", double(s.store->budget())},
                {"kvlab_contexts", "Stored contexts (on disk).", double(s.store->size())},
                {"kvlab_contexts_resident", "Stored contexts whose rows are in memory.", double(s.store->n_resident())},
                {"kvlab_context_reloads_total", "Contexts read back from their files after a drop.",
                 double(s.store->n_reloads())},
                {"kvlab_context_drops_total", "Contexts dropped from memory to stay under the budget.",
                 double(s.store->n_drops())},
                {"kvlab_slots", "Engines computing requests in parallel.", double(s.slots->size())},
                {"kvlab_slots_busy", "Slots working now.", double(s.slots->busy())},
                {"kvlab_queue_waiting", "Requests waiting for a slot.", double(s.slots->waiting())},
                {"kvlab_process_resident_memory_bytes", "RSS of the server process.", double(mi.rss_bytes)},
            }),
            "text/plain; version=0.0.4");
    });
    add_context_routes(s);
    add_completion_routes(s);
}

Server::~Server() = default;

int Server::bind() {
    ServerState & s = *s_;
    if (s.opts.port == 0) {
        s.bound_port = s.http.bind_to_any_port(s.opts.host);
    } else {
        s.bound_port = s.http.bind_to_port(s.opts.host, s.opts.port) ? s.opts.port : -1;
    }
    if (s.bound_port < 0)
        throw Error("serve", "cannot listen on " + s.opts.host + ":" + std::to_string(s.opts.port) +
                                 " (in use, or not an address of this machine)");
    return s.bound_port;
}

void Server::listen() {
    s_->http.listen_after_bind();
}

void Server::stop() {
    s_->http.stop();
}

}  // namespace kvlab::server
