#include "server/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "kvlab/sys.h"
#include "server/peer.h"

namespace kvlab::server {

GrowingPool::~GrowingPool() {
    shutdown();
}

void GrowingPool::enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
    cv_.notify_one();
}

void GrowingPool::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        stop_ = true;
    }
    cv_.notify_all();
    for (std::thread & t : threads_) t.join();
}

void GrowingPool::work() {
    for (;;) {
        std::function<void()> fn;
        {
            std::unique_lock<std::mutex> lock(mu_);
            ++idle_;
            cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
            --idle_;
            if (jobs_.empty()) return;  // stopping, and nothing left to run
            fn = std::move(jobs_.front());
            jobs_.pop_front();
        }
        fn();
    }
}

namespace {

// The descriptor of this process's socket with that inode, -1 when none.
int socket_fd(unsigned long inode) {
    const std::string want = "socket:[" + std::to_string(inode) + "]";
    DIR * d = opendir("/proc/self/fd");
    if (!d) return -1;
    int fd = -1;
    char target[64];
    while (const dirent * e = readdir(d)) {
        const std::string link = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
        if (n > 0 && std::string(target, size_t(n)) == want) {
            fd = std::atoi(e->d_name);
            break;
        }
    }
    closedir(d);
    return fd;
}

// Whether fd is still the connection to `remote` ("ADDR:PORT" in /proc's form): the descriptor
// may have been closed and reused since /proc was read.
bool still_peer(int fd, const std::string & remote) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return false;
    char host[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (ss.ss_family == AF_INET) {
        const auto * a = reinterpret_cast<const sockaddr_in *>(&ss);
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss.ss_family == AF_INET6) {
        const auto * a = reinterpret_cast<const sockaddr_in6 *>(&ss);
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    } else {
        return false;
    }
    const auto forms = proc_endpoints(host, port);
    return std::find(forms.begin(), forms.end(), remote) != forms.end();
}

}  // namespace

ConnectionGuard::ConnectionGuard(ConnectionLimits limits) : limits_(limits) {}

ConnectionGuard::~ConnectionGuard() {
    stop_ = true;
    if (watchdog_.joinable()) watchdog_.join();
}

void ConnectionGuard::watch(int local_port) {
    if (!watchdog_.joinable()) watchdog_ = std::thread([this, local_port] { run(local_port); });
}

void ConnectionGuard::request_started(const httplib::Request & req) {
    const double now = now_seconds();
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string & k : proc_endpoints(req.remote_addr, req.remote_port)) {
        InFlight & f = in_flight_[k];
        ++f.n;
        f.started = now;
    }
}

void ConnectionGuard::request_finished(const httplib::Request & req) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string & k : proc_endpoints(req.remote_addr, req.remote_port)) {
        auto it = in_flight_.find(k);
        if (it != in_flight_.end() && --it->second.n <= 0) in_flight_.erase(it);
    }
}

void ConnectionGuard::run(int local_port) {
    while (!stop_) {
        scan(local_port);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

void ConnectionGuard::scan(int local_port) {
    const std::vector<TcpConnection> conns = tcp_connections(local_port);
    const double now = now_seconds();
    struct Waiting {
        double since;
        const TcpConnection * c;
    };
    std::vector<Waiting> waiting;  // connections with no request in flight, past the grace period
    std::map<std::string, int> per_ip;
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::map<std::string, double> seen;
        for (const TcpConnection & c : conns) {
            const auto it = first_seen_.find(c.remote);
            const double since = it == first_seen_.end() ? now : it->second;
            seen[c.remote] = since;
            ++per_ip[c.remote_ip];
            if (!in_flight_.count(c.remote) && now - since >= limits_.header_grace_s) waiting.push_back({since, &c});
        }
        first_seen_ = std::move(seen);
        // a response whose writing failed is never logged: its mark goes with its connection
        for (auto it = in_flight_.begin(); it != in_flight_.end();)
            it = !first_seen_.count(it->first) && now - it->second.started > 1.0 ? in_flight_.erase(it) : std::next(it);
    }
    n_open_ = int64_t(conns.size());
    // the newest waiting connections first, while a limit is exceeded
    std::sort(waiting.begin(), waiting.end(), [](const Waiting & a, const Waiting & b) { return a.since > b.since; });
    int64_t total = int64_t(conns.size());
    for (const Waiting & w : waiting) {
        const bool over_total = total > limits_.max_connections;
        const bool over_ip = per_ip[w.c->remote_ip] > limits_.max_per_client;
        if (!over_total && !over_ip) continue;
        const int fd = socket_fd(w.c->inode);
        if (fd < 0 || !still_peer(fd, w.c->remote)) continue;
        shutdown(fd, SHUT_RDWR);  // its worker's read ends; httplib closes the socket
        --total;
        --per_ip[w.c->remote_ip];
        ++n_cut_;
    }
}

}  // namespace kvlab::server
