// `kvlab serve`: an HTTP server on one loaded model. OpenAI-compatible completions
// (/v1/chat/completions, /v1/completions, /v1/models), kvlab's stored contexts
// (/v1/contexts: prefill and compress once, answer many times, kept as cache files),
// /health, /metrics (Prometheus) and a web page at /.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/decode_policy.h"
#include "kvlab/engine.h"
#include "kvlab/model.h"
#include "kvlab/text.h"

namespace kvlab::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                  // 0: any free port (the one bound is printed)
    std::string api_key;              // "" : no authentication
    int parallel = 1;                 // slots: requests computed at the same time
    int queue = 16;                   // requests that may wait for a slot
    double queue_timeout_s = 120.0;   // the longest wait for a slot
    int threads = 1;                  // CPU threads in all, shared out among the slots
    uint64_t kv_budget = 1ull << 30;  // resident bytes of stored contexts' rows
    std::string store;                // the stored contexts: a folder, or redis://HOST:PORT[/DB] shared by replicas
    size_t max_body = 16u << 20;      // request body limit, bytes
    int io_timeout_s = 600;           // socket write timeout (a client that does not read)
    int read_timeout_s = 10;          // socket read timeout: a client that stops sending
    int max_connections = 256;        // open connections in all (server/connection_guard.h)
    int max_per_client = 64;          // open connections from one client address
    std::string model_id;             // the id /v1/models lists
    EngineOptions engine;             // chunk size and attention kernel (threads set per slot)
    DecodePolicyOptions decode;       // compression while decoding, every generation (--decode-policy)
    bool prefix_reuse = true;         // a prompt that begins with a stored context's tokens is answered from it
    // Continuous batching (server/batch_scheduler.h): the admitted requests (up to `parallel`)
    // decode in one graph per step on one engine of `threads` threads, a query prefilled at most
    // `batch_chunk` tokens a step. Off, or with a decoding policy: each request alone on its slot.
    bool batching = true;
    int64_t batch_chunk = 64;
};

struct ServerState;  // src/server/state.h

class Server {
public:
    Server(const Model & model, const Tokenizer & tok, ServerOptions opts);
    ~Server();
    // Binds (throws kvlab::Error when it cannot) and returns the port.
    int bind();
    // Serves until stop(); returns when the listener has closed.
    void listen();
    void stop();
    // "folder PATH" or "redis://HOST:PORT/DB" (no password)
    std::string store_description() const;

private:
    std::unique_ptr<ServerState> s_;
};

}  // namespace kvlab::server
