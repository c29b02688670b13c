#include <openssl/crypto.h>
#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"
#include "server/openai.h"
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

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

void post_json(ServerState & s, const std::string & pattern, JsonHandler fn) {
    s.http.Post(pattern,
                [&s, fn](const httplib::Request & req, httplib::Response & res, const httplib::ContentReader & reader) {
                    guarded(res, [&] {
                        // Past the limit the rest is read and dropped, up to as much again, so that a client
                        // that sent a little too much reads its 413 (closing on unread bytes resets the
                        // connection); a flood is cut there.
                        const size_t max = s.opts.max_body;
                        std::string body;
                        size_t seen = 0;
                        const bool read = reader([&](const char * data, size_t n) {
                            seen += n;
                            if (seen <= max) body.append(data, n);
                            return seen <= 2 * max;
                        });
                        const bool over = seen > max;
                        const std::string length = req.get_header_value("Content-Length");
                        if (over || (!read && !length.empty() && std::strtoull(length.c_str(), nullptr, 10) > max)) {
                            res.set_header("Connection", "close");
                            throw ApiError(413,
                                           "the request body is larger than the server's limit of " +
                                               std::to_string(max) + " bytes (--max-body)",
                                           "", "request_too_large");
                        }
                        if (!read) {
                            res.set_header("Connection", "close");
                            throw ApiError(400, "the request body could not be read");
                        }
                        fn(req, parse_json_body(body), res);
                    });
                });
}

void check_prompt_bytes(const ServerState & s, size_t bytes, const std::string & param) {
    if (bytes > s.max_prompt_bytes)
        throw ApiError(400,
                       "the prompt has " + std::to_string(bytes) + " bytes: more than the model's context of " +
                           std::to_string(s.model.hparams().n_ctx_train) + " tokens can hold (at most " +
                           std::to_string(s.max_prompt_bytes) + " bytes are tokenized)",
                       param, "context_length_exceeded");
}

ServerState::ServerState(const Model & m, const Tokenizer & t, ServerOptions o) : model(m), tok(t), opts(std::move(o)) {
    fingerprint = "kvlab-" + kvlab_version() + "-" + kvlab_git_commit();
    size_t longest = 1;
    for (int32_t id = 0; id < tok.n_vocab(); ++id) longest = std::max(longest, tok.piece(id).size());
    max_prompt_bytes = 2 * longest * size_t(model.hparams().n_ctx_train);
}

std::string Server::store_description() const {
    return s_->store->backend().describe();
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
    try {
        s.store = std::make_unique<ContextStore>(model, tok, open_context_backend(o.store, model), o.kv_budget);
    } catch (const ApiError & e) {  // the shared store went away while it was read
        throw Error("serve", e.what());
    }
    s.decode = std::make_unique<DecodePolicy>(o.decode, model);  // the policy's options checked at start
    if (o.batching && o.decode.method == "none") {
        if (o.batch_chunk < 1) throw Error("serve", "--batch-chunk must be at least 1");
        EngineOptions be = o.engine;
        be.n_threads = std::max(1, o.threads);
        s.batch = std::make_unique<BatchScheduler>(model, be, o.parallel, o.batch_chunk);
    }

    if (o.max_connections < 1 || o.max_per_client < 1 || o.read_timeout_s < 1)
        throw Error("serve", "--max-connections, --max-connections-per-client and --read-timeout must be at least 1");
    ConnectionLimits limits;
    limits.max_connections = o.max_connections;
    limits.max_per_client = o.max_per_client;
    s.guard = std::make_unique<ConnectionGuard>(limits);

    httplib::Server & http = s.http;
    const size_t n_workers = size_t(limits.max_connections + limits.reserve_workers);
    http.new_task_queue = [n_workers] { return new GrowingPool(n_workers); };
    http.set_payload_max_length(o.max_body);
    http.set_read_timeout(o.read_timeout_s, 0);
    http.set_write_timeout(o.io_timeout_s, 0);
    http.set_keep_alive_max_count(1000);

    // Before any body is read: an unknown path or method is refused (404, 405 with Allow), a body
    // sent where none is taken is refused (only POST routes read one, bounded), then the key.
    http.set_pre_routing_handler([&s](const httplib::Request & req, httplib::Response & res) {
        s.guard->request_started(req);  // its headers are in: never cut until its response is written
        const std::string allow = allowed_methods(req.path);
        const std::string method = req.method == "HEAD" ? "GET" : req.method;
        if (allow.empty() || allow.find(method) == std::string::npos) {
            res.set_header("Connection", "close");
            if (allow.empty()) {
                send_error(res, ApiError(404, "no route " + req.method + " " + req.path.substr(0, 200)));
            } else {
                res.set_header("Allow", allow);
                send_error(res,
                           ApiError(405, req.method + " " + req.path.substr(0, 200) + ": the path takes " + allow));
            }
            return httplib::Server::HandlerResponse::Handled;
        }
        if (method != "POST" && (req.has_header("Transfer-Encoding") ||
                                 std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > 0)) {
            res.set_header("Connection", "close");
            send_error(res, ApiError(400, req.method + " takes no request body"));
            return httplib::Server::HandlerResponse::Handled;
        }
        if (s.opts.api_key.empty() || req.path == "/health" || req.path == "/")
            return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        // RFC 7235: the scheme is case-insensitive ("bearer KEY" too)
        const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "Bearer ", 7) == 0;
        const std::string given = bearer ? auth.substr(7) : std::string();
        if (!given.empty() && key_matches(given, s.opts.api_key)) return httplib::Server::HandlerResponse::Unhandled;
        send_error(res,
                   ApiError(401, auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'" : "invalid API key",
                            "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
    });
    http.set_error_handler([](const httplib::Request & req, httplib::Response & res) {
        if (!res.body.empty()) return;
        const int st = res.status;
        const std::string msg = st == 404   ? "no route " + req.method + " " + req.path.substr(0, 200)
                                : st == 413 ? "the request body is larger than the server's limit (--max-body)"
                                : st == 414 ? "the request line is longer than the server reads (8 KiB)"
                                : st == 400 ? "malformed HTTP request"
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
        s.guard->request_finished(req);
    });

    add_routes(s);
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
    s.guard->watch(s.bound_port);
    return s.bound_port;
}

void Server::listen() {
    s_->http.listen_after_bind();
}

void Server::stop() {
    s_->http.stop();
}

}  // namespace kvlab::server
