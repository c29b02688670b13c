// Connections that cannot starve the server: cpp-httplib gives each connection a worker thread
// from its first byte to its last, and no hook before a request's headers are read. So a pool
// that grows up to the connection limit plus a reserve (GrowingPool), and a watchdog that reads
// this server's TCP connections from /proc (server/peer.h) every 50 ms and, when there are more
// than --max-connections in all or --max-connections-per-client from one address, shuts down the
// newest of those waiting for a request's headers longer than a grace period. A request whose
// headers arrived (pre-routing) is never cut; /health and /metrics, sent at once, are answered by
// the reserve while slow connections hold every other worker.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvlab::server {

struct ConnectionLimits {
    int max_connections = 256;    // in all
    int max_per_client = 64;      // from one client address
    double header_grace_s = 0.5;  // a connection over a limit may wait this long for its headers
    int reserve_workers = 8;      // threads past max_connections: /health while the rest are held
};

// httplib's TaskQueue with threads made when needed, up to max_threads (its own pool makes them
// all at start).
class GrowingPool : public httplib::TaskQueue {
public:
    explicit GrowingPool(size_t max_threads) : max_(max_threads) {}
    ~GrowingPool() override;
    void enqueue(std::function<void()> fn) override;
    void shutdown() override;

private:
    void work();
    const size_t max_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t idle_ = 0;
    bool stop_ = false;
};

class ConnectionGuard {
public:
    explicit ConnectionGuard(ConnectionLimits limits);
    ~ConnectionGuard();
    ConnectionGuard(const ConnectionGuard &) = delete;
    ConnectionGuard & operator=(const ConnectionGuard &) = delete;
    // Starts watching the connections to local_port (once bound).
    void watch(int local_port);
    // A request's headers have arrived / its response has been written: never cut in between.
    void request_started(const httplib::Request & req);
    void request_finished(const httplib::Request & req);
    const ConnectionLimits & limits() const { return limits_; }
    uint64_t n_cut() const { return n_cut_.load(); }
    int64_t n_open() const { return n_open_.load(); }

private:
    void run(int local_port);
    void scan(int local_port);
    const ConnectionLimits limits_;
    std::mutex mu_;
    struct InFlight {
        int n = 0;             // requests between their headers and their response's end
        double started = 0.0;  // the last one's start
    };
    std::map<std::string, InFlight> in_flight_;  // client "ADDR:PORT" (/proc form) -> its requests
    std::map<std::string, double> first_seen_;   // client "ADDR:PORT" -> when the watchdog saw it
    std::atomic<uint64_t> n_cut_{0};
    std::atomic<int64_t> n_open_{0};
    std::atomic<bool> stop_{false};
    std::thread watchdog_;
};

}  // namespace kvlab::server
