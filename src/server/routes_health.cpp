// GET /health: the server is up, and how many slots are idle and busy (llama-server's shape).
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

const RouteRegistrar reg({{"GET", "/health"}}, [](ServerState & s) {
    s.http.Get("/health", [&s](const httplib::Request &, httplib::Response & res) {
        send_json(res, 200,
                  {{"status", "ok"},
                   {"slots_idle", s.slots->size() - s.slots->busy()},
                   {"slots_processing", s.slots->busy()}});
    });
});

}  // namespace

}  // namespace kvlab::server
