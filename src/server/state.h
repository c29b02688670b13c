// The server's shared state and the helpers its route files use (internal to src/server).
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_error.h"
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
    std::unique_ptr<Slots> slots;
    std::unique_ptr<ContextStore> store;
    Metrics metrics;
    std::string fingerprint;  // "kvlab-<version>-<commit>"
    int bound_port = -1;

    ServerState(const Model & m, const Tokenizer & t, ServerOptions o);
};

// Sends a JSON body with a status.
void send_json(httplib::Response & res, int status, const nlohmann::json & body);
void send_error(httplib::Response & res, const ApiError & e);
// Runs a handler: ApiError -> its status and body; kvlab::Error -> 400; anything else -> 500.
void guarded(httplib::Response & res, const std::function<void()> & fn);

// Route groups, each in its own file.
void add_context_routes(ServerState & s);
void add_completion_routes(ServerState & s);

}  // namespace kvlab::server
