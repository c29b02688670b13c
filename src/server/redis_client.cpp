#include "server/redis_client.h"

#include <sys/time.h>

#include <charconv>

#include "kvlab/error.h"

namespace kvlab::server {

namespace {

timeval timeval_of(double s) {
    timeval tv{};
    tv.tv_sec = time_t(s);
    tv.tv_usec = suseconds_t((s - double(tv.tv_sec)) * 1e6);
    return tv;
}

bool parse_int(std::string_view s, int lo, int hi, int * out) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return false;
    *out = v;
    return true;
}

}  // namespace

RedisAddress RedisAddress::parse(const std::string & url) {
    const auto bad = [&](const std::string & why) {
        return Error("store", "'" + url + "' is not a Redis address (" + why +
                                  "): give redis://[:PASSWORD@]HOST[:PORT][/DB]");
    };
    const std::string scheme = "redis://";
    if (url.rfind(scheme, 0) != 0) throw bad("no redis:// scheme");
    std::string rest = url.substr(scheme.size());
    RedisAddress a;
    const size_t at = rest.rfind('@');
    if (at != std::string::npos) {
        const std::string cred = rest.substr(0, at);
        a.password = cred.substr(cred.find(':') == std::string::npos ? 0 : cred.find(':') + 1);
        rest = rest.substr(at + 1);
    }
    const size_t slash = rest.find('/');
    if (slash != std::string::npos) {
        const std::string db = rest.substr(slash + 1);
        if (!db.empty() && !parse_int(db, 0, 1 << 20, &a.db)) throw bad("the database must be a number");
        rest = rest.substr(0, slash);
    }
    std::string port;
    if (!rest.empty() && rest.front() == '[') {  // [IPv6]:PORT
        const size_t close = rest.find(']');
        if (close == std::string::npos) throw bad("no ']' after an IPv6 host");
        a.host = rest.substr(1, close - 1);
        const std::string after = rest.substr(close + 1);
        if (!after.empty() && after.front() != ':') throw bad("text after the host");
        if (!after.empty()) port = after.substr(1);
    } else {
        const size_t colon = rest.find(':');
        a.host = rest.substr(0, colon);
        if (colon != std::string::npos) port = rest.substr(colon + 1);
    }
    if (!port.empty() && !parse_int(port, 1, 65535, &a.port)) throw bad("bad port");
    if (a.host.empty()) throw bad("no host");
    a.url = scheme + (a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host) + ":" +
            std::to_string(a.port) + "/" + std::to_string(a.db);
    return a;
}

RedisClient::RedisClient(RedisAddress addr, double timeout_s) : addr_(std::move(addr)), timeout_s_(timeout_s) {
    release(connect());  // fails now when the server cannot be reached
}

RedisClient::~RedisClient() = default;

RedisClient::Connection RedisClient::connect() const {
    Connection c(redisConnectWithTimeout(addr_.host.c_str(), addr_.port, timeval_of(timeout_s_)));
    if (!c) throw RedisError("cannot allocate a Redis connection", true);
    if (c->err) throw RedisError("cannot connect to " + addr_.url + ": " + c->errstr, true);
    if (redisSetTimeout(c.get(), timeval_of(timeout_s_)) != REDIS_OK)
        throw RedisError("cannot set the timeout of " + addr_.url, true);
    redisEnableKeepAlive(c.get());
    const auto check = [&](redisReply * raw, const std::string & what) {
        RedisReplyPtr r(raw);
        if (!r) throw RedisError(addr_.url + ": " + what + " failed: " + c->errstr, true);
        if (r->type == REDIS_REPLY_ERROR)
            throw RedisError(addr_.url + ": " + what + " refused: " + std::string(r->str, r->len), true);
    };
    if (!addr_.password.empty()) check(static_cast<redisReply *>(redisCommand(c.get(), "AUTH %s", addr_.password.c_str())), "AUTH");
    if (addr_.db != 0) check(static_cast<redisReply *>(redisCommand(c.get(), "SELECT %d", addr_.db)), "SELECT");
    check(static_cast<redisReply *>(redisCommand(c.get(), "PING")), "PING");
    return c;
}

void RedisClient::release(Connection c) {
    if (!c || c->err) return;  // a broken connection is dropped; the next use connects again
    std::lock_guard<std::mutex> lock(mu_);
    idle_.push_back(std::move(c));
}

namespace {

void append(redisContext * c, const std::vector<std::string_view> & args) {
    std::vector<const char *> argv;
    std::vector<size_t> lens;
    for (std::string_view a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
    }
    redisAppendCommandArgv(c, int(argv.size()), argv.data(), lens.data());
}

}  // namespace

std::vector<RedisReplyPtr> RedisClient::pipeline(const std::vector<std::vector<std::string_view>> & commands) {
    for (int attempt = 0;; ++attempt) {
        bool pooled = false;
        Connection c;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (!idle_.empty()) {
                c = std::move(idle_.back());
                idle_.pop_back();
                pooled = true;
            }
        }
        if (!c) c = connect();
        for (const auto & args : commands) append(c.get(), args);
        std::vector<RedisReplyPtr> out;
        for (size_t i = 0; i < commands.size(); ++i) {
            void * raw = nullptr;
            if (redisGetReply(c.get(), &raw) != REDIS_OK || !raw) break;
            out.emplace_back(static_cast<redisReply *>(raw));
        }
        if (out.size() == commands.size()) {
            release(std::move(c));
            return out;
        }
        const std::string why = c->errstr[0] ? c->errstr : "no reply";
        // a pooled connection the server closed meanwhile (a restart, an idle timeout) fails on
        // its first use without a reply: once more on a new one
        if (pooled && out.empty() && attempt == 0) continue;
        throw RedisError(addr_.url + ": " + why, true);  // c is broken: dropped here
    }
}

RedisReplyPtr RedisClient::command(const std::vector<std::string_view> & args) {
    std::vector<RedisReplyPtr> r = pipeline({args});
    if (r[0]->type == REDIS_REPLY_ERROR)
        throw RedisError(addr_.url + " refused " + std::string(args[0]) + ": " + std::string(r[0]->str, r[0]->len),
                         false);
    return std::move(r[0]);
}

}  // namespace kvlab::server
