// The server's shared state and the helpers its route files use (internal to src/server).
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"
#include "server/batch_scheduler.h"
#include "server/connection_guard.h"
#include "server/context_store.h"
#include "server/metrics.h"
#include "server/server.h"
#include "server/slots.h"

namespace kvlab::server {

struct ServerState {
    const Model & model;
    const Tokenizer & tok;
    ServerOptions opts;
    httplib::Server http;
    std::unique_ptr<Slots> slots;           // admission (and the engines of contexts and of policies)
    std::unique_ptr<BatchScheduler> batch;  // the decoding loop; null: each request on its slot
    std::unique_ptr<ContextStore> store;
    std::unique_ptr<ConnectionGuard> guard;
    Metrics metrics;
    std::string fingerprint;  // "kvlab-<version>-<commit>"
    // The longest text a prompt or context may have, checked before it is tokenized: twice the
    // model's context times the longest token's bytes (no text of more bytes fits in the context).
    size_t max_prompt_bytes = 0;
    int bound_port = -1;
    // compression while decoding: the policy made once at start (its options checked, what its
    // method loads read once), from which every request takes its own (DecodePolicy::another)
    std::unique_ptr<DecodePolicy> decode;

    ServerState(const Model & m, const Tokenizer & t, ServerOptions o);
};

// Sends a JSON body with a status.
void send_json(httplib::Response & res, int status, const nlohmann::json & body);
void send_error(httplib::Response & res, const ApiError & e);
// Runs a handler: ApiError -> its status and body; kvlab::Error -> 400; anything else -> 500.
void guarded(httplib::Response & res, const std::function<void()> & fn);

// A POST route with a JSON body that kvlab reads itself, up to --max-body however it is framed
// (Content-Length or chunked): 413 past the limit (the rest is not read; the connection closes),
// 400 for malformed JSON; then fn, guarded.
using JsonHandler = std::function<void(const httplib::Request &, const nlohmann::json & body, httplib::Response &)>;
void post_json(ServerState & s, const std::string & pattern, JsonHandler fn);

// 400 (context_length_exceeded) when `bytes` of text cannot fit in the model's context, before
// any tokenization (s.max_prompt_bytes); param names the field.
void check_prompt_bytes(const ServerState & s, size_t bytes, const std::string & param);

}  // namespace kvlab::server
