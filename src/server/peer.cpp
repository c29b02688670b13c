#include "server/peer.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kvlab/sys.h"

namespace kvlab::server {

namespace {

// An address as /proc/net/tcp{,6} prints it: the 32-bit words of the address in host order,
// %08X each; an IPv4 address seen through an IPv6 socket as ::ffff:a.b.c.d.
bool proc_address(const std::string & addr, bool v6, std::string & out) {
    char buf[40] = {};
    if (!v6) {
        in_addr a{};
        if (inet_pton(AF_INET, addr.c_str(), &a) != 1) return false;
        std::snprintf(buf, sizeof(buf), "%08X", a.s_addr);
    } else {
        in6_addr a{};
        if (inet_pton(AF_INET6, addr.c_str(), &a) != 1) {
            in_addr a4{};
            if (inet_pton(AF_INET, addr.c_str(), &a4) != 1) return false;
            std::memset(&a, 0, sizeof(a));
            a.s6_addr[10] = a.s6_addr[11] = 0xff;
            std::memcpy(&a.s6_addr[12], &a4, 4);
        }
        uint32_t w[4];
        std::memcpy(w, &a, 16);
        std::snprintf(buf, sizeof(buf), "%08X%08X%08X%08X", w[0], w[1], w[2], w[3]);
    }
    out = buf;
    return true;
}

std::string endpoint(const std::string & proc_addr, int port) {
    char p[8];
    std::snprintf(p, sizeof(p), ":%04X", unsigned(port) & 0xffffu);
    return proc_addr + p;
}

// The sockets of one of /proc/self/net/tcp{,6}: local and remote "ADDR:PORT", state, inode.
struct TcpLine {
    std::string local, remote, state;
    unsigned long inode = 0;
};

std::vector<TcpLine> read_table(bool v6) {
    std::ifstream in(v6 ? "/proc/self/net/tcp6" : "/proc/self/net/tcp");
    std::vector<TcpLine> out;
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string sl, queues, timer, retr, uid, timeout;
        TcpLine t;
        if (f >> sl >> t.local >> t.remote >> t.state >> queues >> timer >> retr >> uid >> timeout >> t.inode)
            out.push_back(std::move(t));
    }
    return out;
}

}  // namespace

std::vector<TcpConnection> tcp_connections(int local_port) {
    const std::string port = endpoint("", local_port);  // ":PPPP"
    std::vector<TcpConnection> out;
    for (const bool v6 : {false, true})
        for (TcpLine & t : read_table(v6)) {
            // connections of ours that a worker holds: established (01), or closed by the client
            // and not yet by us (08, CLOSE_WAIT); not the listener, nor those we closed already
            if (!t.local.ends_with(port) || (t.state != "01" && t.state != "08")) continue;
            TcpConnection c;
            c.remote_ip = t.remote.substr(0, t.remote.find(':'));
            c.remote = std::move(t.remote);
            c.state = std::move(t.state);
            c.inode = t.inode;
            out.push_back(std::move(c));
        }
    return out;
}

std::vector<std::string> proc_endpoints(const std::string & addr, int port) {
    std::vector<std::string> out;
    for (const bool v6 : {false, true}) {
        std::string a;
        if (proc_address(addr, v6, a)) out.push_back(endpoint(a, port));
    }
    return out;
}

std::string tcp_state(const std::string & local_addr, int local_port, const std::string & remote_addr,
                      int remote_port) {
    for (const bool v6 : {false, true}) {
        std::string la, ra;
        if (!proc_address(local_addr, v6, la) || !proc_address(remote_addr, v6, ra)) continue;
        const std::string local = endpoint(la, local_port), remote = endpoint(ra, remote_port);
        for (const TcpLine & t : read_table(v6))
            if (t.local == local && t.remote == remote) return t.state;
    }
    return "";
}

PeerWatch::PeerWatch(const httplib::Request & req, double interval_s)
    : local_addr_(req.local_addr),
      remote_addr_(req.remote_addr),
      local_port_(req.local_port),
      remote_port_(req.remote_port),
      interval_s_(interval_s) {}

bool PeerWatch::gone() {
    if (gone_) return true;
    const double now = now_seconds();
    if (now < next_check_) return false;
    next_check_ = now + interval_s_;
    const std::string st = tcp_state(local_addr_, local_port_, remote_addr_, remote_port_);
    gone_ = st.empty() || st == "08";  // closed, or CLOSE_WAIT
    return gone_;
}

}  // namespace kvlab::server
