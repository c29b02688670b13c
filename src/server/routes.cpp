#include "server/routes.h"

#include <algorithm>
#include <utility>

#include "kvlab/error.h"

namespace kvlab::server {

namespace {

struct Registered {
    std::vector<Endpoint> endpoints;
    RouteSetup setup;
};

std::vector<Registered> & registry() {
    static std::vector<Registered> r;
    return r;
}

// Whether a request's path matches a registered path, segment by segment ({name}: any segment).
bool matches(const std::string & pattern, const std::string & path) {
    size_t i = 0, j = 0;
    while (i < pattern.size() && j < path.size()) {
        if (pattern[i] == '{') {
            const size_t close = pattern.find('}', i);
            const size_t end = path.find('/', j);
            if (end == j) return false;  // an empty segment
            i = close + 1;
            j = end == std::string::npos ? path.size() : end;
            continue;
        }
        if (pattern[i] != path[j]) return false;
        ++i, ++j;
    }
    return i == pattern.size() && j == path.size();
}

}  // namespace

RouteRegistrar::RouteRegistrar(std::vector<Endpoint> endpoints, RouteSetup setup) {
    KVLAB_ASSERT(setup != nullptr, "a route registers its setup");
    registry().push_back({std::move(endpoints), setup});
}

void add_routes(ServerState & s) {
    for (const Registered & r : registry()) r.setup(s);
}

std::string endpoint_of(const std::string & path) {
    for (const Registered & r : registry())
        for (const Endpoint & e : r.endpoints)
            if (matches(e.path, path)) return e.path;
    return "other";
}

std::string allowed_methods(const std::string & path) {
    std::vector<std::string> methods;
    for (const Registered & r : registry())
        for (const Endpoint & e : r.endpoints)
            if (matches(e.path, path) && std::find(methods.begin(), methods.end(), e.method) == methods.end())
                methods.push_back(e.method);
    std::string out;
    for (const std::string & m : methods) out += (out.empty() ? "" : ", ") + m;
    return out;
}

}  // namespace kvlab::server
