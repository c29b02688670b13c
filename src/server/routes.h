// The endpoint seam: each src/server/routes_*.cpp registers its endpoints and the function that
// adds their handlers, at static initialisation; the server adds every registered one. Adding an
// endpoint is one file:
//   const RouteRegistrar reg({{"GET", "/health"}}, [](ServerState & s) { s.http.Get("/health", ...); });
// The registry also names each request's endpoint for the metrics (ids folded into {id}) and
// says which methods a path takes (405 with Allow).
#pragma once

#include <string>
#include <vector>

namespace kvlab::server {

struct ServerState;

struct Endpoint {
    std::string method;  // "GET", "POST", "DELETE"
    std::string path;    // "/v1/contexts/{id}": a {name} segment matches any one segment
};

using RouteSetup = void (*)(ServerState & s);

struct RouteRegistrar {
    RouteRegistrar(std::vector<Endpoint> endpoints, RouteSetup setup);
};

// Adds the handlers of every registered endpoint to s.http.
void add_routes(ServerState & s);
// The registered path a request's path matches ("/v1/contexts/{id}"), or "other".
std::string endpoint_of(const std::string & path);
// The methods registered for the path a request's path matches, "GET, DELETE"; "" for none.
std::string allowed_methods(const std::string & path);

}  // namespace kvlab::server
