// GET /metrics: the server's figures in Prometheus' text format (server/metrics.h), the gauges
// read when scraped.
#include "kvlab/sys.h"
#include "server/routes.h"
#include "server/state.h"

namespace kvlab::server {

namespace {

const RouteRegistrar reg({{"GET", "/metrics"}}, [](ServerState & s) {
    s.http.Get("/metrics", [&s](const httplib::Request &, httplib::Response & res) {
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
                {"kvlab_connections_open", "TCP connections open to the server.", double(s.guard->n_open())},
                {"kvlab_connections_cut_total",
                 "Connections shut down while waiting for a request past --max-connections or "
                 "--max-connections-per-client.",
                 double(s.guard->n_cut())},
            }),
            "text/plain; version=0.0.4");
    });
});

}  // namespace

}  // namespace kvlab::server
