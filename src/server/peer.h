// Whether a client that sent a request is still there, for a request whose answer is written
// only at the end (a non-streamed completion): cpp-httplib gives handlers no socket, so the
// connection's TCP state is read from Linux's /proc/self/net/tcp{,6}, found by its addresses.
#pragma once

#include <httplib.h>

#include <string>
#include <vector>

namespace kvlab::server {

// The TCP state of the connection of (local, remote) address and port: "" when not found (closed),
// else /proc's state code ("01" established, "08" CLOSE_WAIT: the peer closed its side).
std::string tcp_state(const std::string & local_addr, int local_port, const std::string & remote_addr, int remote_port);

// The TCP connections whose local port is `local_port` (this server's) that a worker may hold:
// established, or closed by the client only (CLOSE_WAIT); from both tables.
struct TcpConnection {
    std::string remote;     // /proc's "ADDR:PORT" of the client (hex; the table's address form)
    std::string remote_ip;  // its ADDR part
    std::string state;      // "01" established, "08" CLOSE_WAIT, ...
    unsigned long inode = 0;
};
std::vector<TcpConnection> tcp_connections(int local_port);

// A client's "ADDR:PORT" as tcp_connections() gives it, for an address of either family as
// httplib gives it ("127.0.0.1", "::1"): its IPv4 and its IPv6 (v4-mapped) forms.
std::vector<std::string> proc_endpoints(const std::string & addr, int port);

class PeerWatch {
public:
    explicit PeerWatch(const httplib::Request & req, double interval_s = 0.2);
    // True once the client closed its side of the connection (or the connection is gone);
    // reads /proc at most once per interval.
    bool gone();

private:
    std::string local_addr_, remote_addr_;
    int local_port_, remote_port_;
    double interval_s_, next_check_ = 0.0;
    bool gone_ = false;
};

}  // namespace kvlab::server
