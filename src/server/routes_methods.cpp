// GET /v1/methods: the compression methods this server runs (the registry `kvlab methods` prints),
// with their parameters, defaults and choices; the page fills its method list from it.
#include "kvlab/press.h"
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

nlohmann::json methods_json() {
    nlohmann::json data = nlohmann::json::array();
    for (const MethodInfo & m : press_methods()) {
        nlohmann::json j = m.to_json();
        j["id"] = m.name;
        j["object"] = "method";
        data.push_back(std::move(j));
    }
    return {{"object", "list"}, {"data", data}};
}

const RouteRegistrar reg({{"GET", "/v1/methods"}}, [](ServerState & s) {
    s.http.Get("/v1/methods",
               [](const httplib::Request &, httplib::Response & res) { send_json(res, 200, methods_json()); });
});

}  // namespace

}  // namespace kvlab::server
