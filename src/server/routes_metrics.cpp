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
        const BackendCounts st = s.store->store_counts();
        const BatchScheduler::Counts bc = s.batch ? s.batch->counts() : BatchScheduler::Counts{};
        res.set_content(
            s.metrics.render({
                {"kvlab_kv_resident_bytes", "Bytes of stored contexts' KV rows resident in memory.",
                 double(s.store->resident_bytes())},
                {"kvlab_kv_budget_bytes", "The --kv-budget the resident rows stay under.", double(s.store->budget())},
                {"kvlab_contexts", "Stored contexts (in the store: a folder or a shared Redis).",
                 double(s.store->size())},
                {"kvlab_contexts_resident", "Stored contexts whose rows are in memory.", double(s.store->n_resident())},
                {"kvlab_context_reloads_total", "Contexts read back from the store after a drop.",
                 double(s.store->n_reloads())},
                {"kvlab_context_drops_total", "Contexts dropped from memory to stay under the budget.",
                 double(s.store->n_drops())},
                {"kvlab_store_hits_total",
                 "Store entries read: rows loaded, or a context asked for again (or made by another replica) reused.",
                 double(st.hits)},
                {"kvlab_store_misses_total",
                 "Store entries looked for and absent: contexts made here, rows evicted or deleted elsewhere.",
                 double(st.misses)},
                {"kvlab_store_writes_total", "Store entries written.", double(st.writes)},
                {"kvlab_store_errors_total", "Store operations that failed: unreachable store, unreadable entries.",
                 double(st.errors)},
                {"kvlab_store_read_bytes_total", "Bytes read from the store.", double(st.bytes_read)},
                {"kvlab_store_written_bytes_total", "Bytes written to the store.", double(st.bytes_written)},
                {"kvlab_store_up", "1 when the store answered its last operation.",
                 s.store->backend().healthy() ? 1.0 : 0.0},
                {"kvlab_slots", "Engines computing requests in parallel.", double(s.slots->size())},
                {"kvlab_slots_busy", "Slots working now.", double(s.slots->busy())},
                {"kvlab_queue_waiting", "Requests waiting for a slot.", double(s.slots->waiting())},
                {"kvlab_batching", "1 when requests decode together (continuous batching), 0 each on its slot.",
                 s.batch ? 1.0 : 0.0},
                {"kvlab_batch_steps_total", "Decoding-loop steps (one graph each).", double(bc.steps)},
                {"kvlab_batch_rows_total",
                 "Requests summed over the decoding loop's steps (over steps: the mean batch).",
                 double(bc.batched_rows)},
                {"kvlab_batch_size", "Requests in the decoding loop's last step.", double(bc.last_batch)},
                {"kvlab_batch_running", "Requests in the decoding loop now.", double(bc.running)},
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
