// GET /health: the server is up, how many slots are idle and busy (llama-server's shape), and
// whether its context store answers.
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

const RouteRegistrar reg({{"GET", "/health"}}, [](ServerState & s) {
    s.http.Get("/health", [&s](const httplib::Request &, httplib::Response & res) {
        send_json(res, 200,
                  {{"status", "ok"},
                   {"slots_idle", s.slots->size() - s.slots->busy()},
                   {"slots_processing", s.slots->busy()},
                   {"store", {{"kind", s.store->backend().describe()}, {"up", s.store->backend().healthy()}}}});
    });
});

}  // namespace

}  // namespace kvlab::server
