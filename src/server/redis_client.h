// A thread-safe client of a Redis-protocol server (Redis, Valkey) on hiredis: a pool of
// connections, each used by one thread at a time, made again after an error.
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab::server {

// redis://[:PASSWORD@]HOST[:PORT][/DB]
struct RedisAddress {
    std::string host;
    int port = 6379;
    int db = 0;
    std::string password;
    std::string url;  // as given, without the password
    // Throws kvlab::Error for anything else.
    static RedisAddress parse(const std::string & url);
};

// A failure to reach the server (connect, send, receive, timeout): `unreachable`; or an error
// reply (a command the server refused).
struct RedisError : std::runtime_error {
    bool unreachable;
    RedisError(const std::string & what, bool unreachable) : std::runtime_error(what), unreachable(unreachable) {}
};

struct RedisReplyFree {
    void operator()(redisReply * r) const { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyFree>;

class RedisClient {
public:
    // Connects once to check the address (throws RedisError when it cannot); timeout_s bounds
    // each connect and each reply.
    RedisClient(RedisAddress addr, double timeout_s);
    ~RedisClient();
    RedisClient(const RedisClient &) = delete;
    RedisClient & operator=(const RedisClient &) = delete;

    // One command; an error reply throws RedisError(unreachable = false).
    RedisReplyPtr command(const std::vector<std::string_view> & args);
    // Several commands sent at once, their replies in order (error replies returned, not thrown).
    std::vector<RedisReplyPtr> pipeline(const std::vector<std::vector<std::string_view>> & commands);

    const RedisAddress & address() const { return addr_; }

private:
    struct ContextFree {
        void operator()(redisContext * c) const { redisFree(c); }
    };
    using Connection = std::unique_ptr<redisContext, ContextFree>;
    Connection connect() const;
    void release(Connection c);

    RedisAddress addr_;
    double timeout_s_;
    std::mutex mu_;
    std::vector<Connection> idle_;
};

}  // namespace kvlab::server
