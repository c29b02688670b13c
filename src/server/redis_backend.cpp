// The shared store: contexts in a Redis-protocol server, one hash per context,
//   kvlab:ctx:ID  {info: JSON {model_sha256, text, tokens, context}, kvc: the cache file's bytes}
// written by one HSET (Redis applies a command whole or not at all: a writer killed mid-send
// leaves nothing), evicted whole by Redis' maxmemory policy; kvlab:gen counts additions and
// removals (replicas rescan when it moves); kvlab:lock:ID is held, with a time to live renewed
// by its holder, while a replica makes that context.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "server/context_backend.h"
#include "server/context_store.h"
#include "server/redis_client.h"

namespace kvlab::server {

namespace {

constexpr double k_timeout_s = 30.0;           // connect and each reply (an entry may be ~100 MB)
constexpr int64_t k_lock_ttl_ms = 10000;       // a dead holder's lock lapses within this
constexpr int64_t k_lock_renew_ms = 3000;      // the holder renews it this often
constexpr int64_t k_lock_wait_ms = 600 * 1000;  // the longest wait for another replica's making
constexpr std::string_view k_gen = "kvlab:gen";

std::string entry_key(const std::string & id) {
    return "kvlab:ctx:" + id;
}
std::string lock_key(const std::string & id) {
    return "kvlab:lock:" + id;
}
std::string_view view(const redisReply & r) {
    return {r.str, r.len};
}

// Deletes / renews the lock only while it holds our token (another may hold it after a lapse).
constexpr std::string_view k_release_script =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
constexpr std::string_view k_renew_script =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";

std::string random_token() {
    std::random_device rd;
    char b[33];
    std::snprintf(b, sizeof(b), "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return b;
}

class RedisLock final : public CreationLock {
public:
    RedisLock(RedisClient & client, std::string key, std::string token)
        : client_(client), key_(std::move(key)), token_(std::move(token)), renewer_([this] { renew(); }) {}
    ~RedisLock() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            done_ = true;
        }
        cv_.notify_all();
        renewer_.join();
        try {
            client_.command({"EVAL", k_release_script, "1", key_, token_});
        } catch (const RedisError &) {  // it lapses by itself
        }
    }

private:
    void renew() {
        const std::string ttl = std::to_string(k_lock_ttl_ms);
        std::unique_lock<std::mutex> lock(mu_);
        while (!cv_.wait_for(lock, std::chrono::milliseconds(k_lock_renew_ms), [this] { return done_; })) {
            try {
                client_.command({"EVAL", k_renew_script, "1", key_, token_, ttl});
            } catch (const RedisError &) {  // the store is down: the making fails on its write
            }
        }
    }

    RedisClient & client_;
    std::string key_, token_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool done_ = false;
    std::thread renewer_;
};

class RedisBackend final : public ContextBackend {
public:
    RedisBackend(const RedisAddress & addr, const Model & model)
        : client_(addr, k_timeout_s), model_(model), sha_(model.file_sha256()) {}

    std::string describe() const override { return client_.address().url; }

    std::vector<StoredEntry> scan() override {
        std::vector<std::string> keys;
        guard([&] {
            std::string cursor = "0";
            do {
                RedisReplyPtr r = client_.command({"SCAN", cursor, "MATCH", "kvlab:ctx:*", "COUNT", "1000"});
                if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) throw RedisError("SCAN: unexpected reply", false);
                cursor = std::string(view(*r->element[0]));
                for (size_t i = 0; i < r->element[1]->elements; ++i) keys.emplace_back(view(*r->element[1]->element[i]));
            } while (cursor != "0");
        });
        std::vector<StoredEntry> out;
        constexpr size_t k_batch = 64;
        for (size_t at = 0; at < keys.size(); at += k_batch) {
            std::vector<std::vector<std::string_view>> cmds;
            for (size_t i = at; i < std::min(keys.size(), at + k_batch); ++i) {
                cmds.push_back({"HGET", keys[i], "info"});
                cmds.push_back({"HSTRLEN", keys[i], "kvc"});
            }
            std::vector<RedisReplyPtr> replies;
            guard([&] { replies = client_.pipeline(cmds); });
            for (size_t i = at, j = 0; i < std::min(keys.size(), at + k_batch); ++i, j += 2) {
                const std::string id = keys[i].substr(std::string("kvlab:ctx:").size());
                if (replies[j]->type != REDIS_REPLY_STRING) continue;  // evicted meanwhile
                std::optional<StoredEntry> e = parse_info(id, view(*replies[j]));
                if (!e) continue;
                e->bytes = replies[j + 1]->type == REDIS_REPLY_INTEGER ? uint64_t(replies[j + 1]->integer) : 0;
                out.push_back(std::move(*e));
            }
        }
        return out;
    }

    uint64_t generation() override {
        uint64_t g = 0;
        guard([&] {
            RedisReplyPtr r = client_.command({"GET", k_gen});
            g = r->type == REDIS_REPLY_STRING ? std::stoull(std::string(view(*r))) : 0;
        });
        return g;
    }

    std::optional<StoredEntry> find(const std::string & id) override {
        const std::string key = entry_key(id);
        std::vector<RedisReplyPtr> r;
        guard([&] { r = client_.pipeline({{"HGET", key, "info"}, {"HSTRLEN", key, "kvc"}}); });
        if (r[0]->type != REDIS_REPLY_STRING) return std::nullopt;
        std::optional<StoredEntry> e = parse_info(id, view(*r[0]));
        if (e && r[1]->type == REDIS_REPLY_INTEGER) e->bytes = uint64_t(r[1]->integer);
        return e;
    }

    uint64_t put(const std::string & id, const KvStore & rows, const CacheFileContent & content) override {
        const std::string kvc = encode_cache_file(model_, rows, content);
        const nlohmann::json info = {
            {"model_sha256", sha_}, {"text", content.text}, {"tokens", content.tokens}, {"context", content.context}};
        const std::string info_text = info.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        const std::string key = entry_key(id);
        guard([&] {
            client_.command({"HSET", key, "info", info_text, "kvc", kvc});
            client_.command({"INCR", k_gen});
        });
        std::lock_guard<std::mutex> lock(mu_);
        ++counts_.writes;
        counts_.bytes_written += kvc.size() + info_text.size();
        return kvc.size();
    }

    LoadedCacheFile get(const std::string & id) override {
        RedisReplyPtr r;
        const double t0 = now_seconds();
        guard([&] { r = client_.command({"HGET", entry_key(id), "kvc"}); });
        const double fetch_s = now_seconds() - t0;
        if (r->type != REDIS_REPLY_STRING) {
            count([](BackendCounts & c) { ++c.misses; });
            throw ApiError(404, "no context '" + id + "' (it is no longer in the shared store: evicted or deleted)",
                           "context", "context_not_found");
        }
        const std::string name = describe() + " " + entry_key(id);
        try {
            LoadedCacheFile f =
                decode_cache_file(name, reinterpret_cast<const uint8_t *>(r->str), r->len, model_, 0);
            f.read_s = fetch_s;
            if (f.content.context.value("id", "") != id)
                throw Error("store", name + ": holds context '" + f.content.context.value("id", "") +
                                         "' (a copied entry)");
            count([&](BackendCounts & c) {
                ++c.hits;
                c.bytes_read += r->len;
            });
            return f;
        } catch (const Error & err) {  // corrupt or foreign: logged, refused, never served
            std::fprintf(stderr, "[serve] context %s: %s\n", id.c_str(), err.what());
            count([](BackendCounts & c) { ++c.errors; });
            throw ApiError(500, "the stored context '" + id + "' could not be read (the server's log says why)",
                           "context", "context_unreadable");
        }
    }

    bool remove(const std::string & id) override {
        bool removed = false;
        guard([&] {
            removed = client_.command({"DEL", entry_key(id)})->integer > 0;
            client_.command({"INCR", k_gen});
        });
        return removed;
    }

    std::unique_ptr<CreationLock> lock(const std::string & id) override {
        const std::string key = lock_key(id), token = random_token(), ttl = std::to_string(k_lock_ttl_ms);
        const auto start = std::chrono::steady_clock::now();
        for (int wait_ms = 20;; wait_ms = std::min(wait_ms * 2, 200)) {
            bool got = false;
            guard([&] { got = client_.command({"SET", key, token, "NX", "PX", ttl})->type == REDIS_REPLY_STATUS; });
            if (got) return std::make_unique<RedisLock>(client_, key, token);
            if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(k_lock_wait_ms))
                throw ApiError(503, "another replica has been making this context for over " +
                                        std::to_string(k_lock_wait_ms / 1000) + " s; try again later",
                               "text", "context_busy");
            std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
        }
    }

    BackendCounts counts() const override {
        std::lock_guard<std::mutex> lock(mu_);
        return counts_;
    }

    bool healthy() const override {
        std::lock_guard<std::mutex> lock(mu_);
        return healthy_;
    }

private:
    // Runs a store operation: an unreachable store -> 503 (counted); a refused command -> 500.
    template <typename F>
    void guard(F && f) {
        try {
            f();
            std::lock_guard<std::mutex> lock(mu_);
            healthy_ = true;
        } catch (const RedisError & e) {
            std::fprintf(stderr, "[serve] store: %s\n", e.what());
            {
                std::lock_guard<std::mutex> lock(mu_);
                ++counts_.errors;
                if (e.unreachable) healthy_ = false;
            }
            if (e.unreachable) throw store_unavailable(describe(), e.what());
            throw ApiError(500, std::string("the shared context store refused a command: ") + e.what(), "context",
                           "store_error");
        }
    }

    template <typename F>
    void count(F && f) {
        std::lock_guard<std::mutex> lock(mu_);
        f(counts_);
    }

    // An entry's info; nullopt (reported once) when it is another model's or unreadable.
    std::optional<StoredEntry> parse_info(const std::string & id, std::string_view text) {
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        const auto refuse = [&](const std::string & why) -> std::optional<StoredEntry> {
            std::lock_guard<std::mutex> lock(mu_);
            if (reported_.insert(id).second) std::fprintf(stderr, "[serve] store entry %s: %s; not served\n", id.c_str(), why.c_str());
            return std::nullopt;
        };
        if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array() || !j.contains("context") ||
            !j["context"].is_object() || !j.contains("text") || !j["text"].is_string())
            return refuse("unreadable description");
        if (j.value("model_sha256", "") != sha_) return refuse("made with another model");
        if (!valid_context_id(id) || j["context"].value("id", "") != id) return refuse("holds another context's id");
        StoredEntry e;
        e.id = id;
        e.content.text = j["text"];
        try {
            e.content.tokens = j["tokens"].get<std::vector<int32_t>>();
        } catch (const nlohmann::json::exception &) {
            return refuse("unreadable tokens");
        }
        e.content.context = j["context"];
        return e;
    }

    RedisClient client_;
    const Model & model_;
    std::string sha_;
    mutable std::mutex mu_;
    BackendCounts counts_;
    bool healthy_ = true;
    std::set<std::string> reported_;
};

}  // namespace

std::unique_ptr<ContextBackend> open_redis_backend(const std::string & url, const Model & model) {
    const RedisAddress addr = RedisAddress::parse(url);
    try {
        return std::make_unique<RedisBackend>(addr, model);
    } catch (const RedisError & e) {
        throw Error("store", std::string(e.what()) + " (is a Redis server running there?)");
    }
}

}  // namespace kvlab::server
