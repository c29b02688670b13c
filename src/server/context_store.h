// The server's stored contexts: each one an entry of its back end (a cache file in the store
// folder, or an entry of a Redis store shared with other replicas: server/context_backend.h)
// and, while memory allows, its rows resident. The resident rows of all contexts stay under a
// byte budget: the least recently used are dropped from memory and read back from the store
// when a request needs them (the same rows: answers are identical). A context's id is the
// address of its content (context_key.h): replicas asked to make the same context agree on it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "kvlab/cache_file.h"
#include "kvlab/model.h"
#include "kvlab/text.h"
#include "server/api_error.h"
#include "server/context_backend.h"

namespace kvlab::server {

// What a request needs to build its prompt on a context, and the API object describing it.
struct ContextInfo {
    std::string id;
    std::string text;                 // the context's text
    std::vector<ChatMessage> before;  // messages before it (a system message)
    std::vector<int32_t> tokens;      // its tokens: the rows' positions 0 .. n-1
    std::string prompt_text;          // the chat text they encode (Tokenizer::context_text; "" without a template)
    nlohmann::json object;            // the API object (GET /v1/contexts/{id}) without "resident"
};

class ContextStore {
public:
    // Registers every context of the back end made with this model (others are listed on stderr
    // and left alone); their rows are read on first use.
    ContextStore(const Model & model, const Tokenizer & tok, std::unique_ptr<ContextBackend> backend,
                 uint64_t kv_budget);

    // Saves the context under `id` and keeps its rows resident. `object` is completed with id,
    // created and file bytes. Throws ApiError(400) when the rows alone exceed the budget, and
    // the back end's errors (503 when a shared store is unreachable).
    nlohmann::json add(const std::string & id, KvStore rows, const CacheFileContent & content,
                       nlohmann::json object);
    // Held while the context `id` is made: one maker at a time in this process and, with a
    // shared store, among the replicas. Check existing() again once it is held.
    struct Making {
        std::unique_lock<std::mutex> local;
        std::unique_ptr<CreationLock> shared;
    };
    Making making(const std::string & id);
    // The API object of context `id` when it is stored (here, or made meanwhile by another
    // replica); null when not.
    nlohmann::json existing(const std::string & id);
    // A request to make a context answered by an existing one (a store hit) or made (a miss).
    void count_making(bool reused);
    // nullptr when there is no such context.
    std::shared_ptr<const ContextInfo> info(const std::string & id);
    // The stored context with the most tokens that are a proper prefix of `tokens` (at least one
    // token left after it); ties go to the earliest id. nullptr when none is.
    std::shared_ptr<const ContextInfo> longest_prefix(const std::vector<int32_t> & tokens);
    // The same by text: the context whose prompt_text is the longest proper prefix of a
    // conversation's rendered chat text (tokens may split differently at the boundary: a context
    // ending in newlines before "\n\nQuestion: ").
    std::shared_ptr<const ContextInfo> longest_prefix(const std::string & chat_text);
    // The rows, read back from the store when they had been dropped (load_s: the time that
    // took; 0 when resident). Throws ApiError(404) when the context is gone (deleted, or
    // evicted from a shared store), 500 when its entry is unreadable, 503 when the store is down.
    std::shared_ptr<const KvStore> rows(const std::string & id, double * load_s);
    nlohmann::json describe(const std::string & id);  // null when unknown
    nlohmann::json list();
    bool remove(const std::string & id);

    uint64_t budget() const { return budget_; }
    uint64_t resident_bytes() const;
    size_t size() const;
    size_t n_resident() const;
    uint64_t n_reloads() const;
    uint64_t n_drops() const;
    // The back end's traffic, with the makings answered by an existing entry (hits) or not (misses).
    BackendCounts store_counts() const;
    const ContextBackend & backend() const { return *backend_; }

private:
    struct Entry {
        std::shared_ptr<const ContextInfo> info;
        std::shared_ptr<const KvStore> rows;  // null while dropped
        uint64_t bytes = 0;                   // the rows' allocation when resident
        uint64_t last_used = 0;               // a logical clock
        uint64_t added = 0;                   // adds_ when this process added it (0: found in the store)
        std::mutex load;                      // one reader of the store at a time
    };
    std::shared_ptr<Entry> entry_of(StoredEntry e) const;
    nlohmann::json object_of(const Entry & e) const;
    void drop_to_budget(const std::string & keep);  // under mu_
    // Reads the back end's entries again when another process changed them (a shared store);
    // keeps the index it has while the store cannot be reached.
    void sync();

    const Model & model_;
    const Tokenizer & tok_;
    std::unique_ptr<ContextBackend> backend_;
    uint64_t budget_;
    mutable std::mutex mu_;
    std::map<std::string, std::shared_ptr<Entry>> entries_;
    uint64_t clock_ = 0, reloads_ = 0, drops_ = 0, adds_ = 0;
    uint64_t make_hits_ = 0, make_misses_ = 0;
    uint64_t generation_ = 0;
    double next_retry_s_ = 0.0;  // while the store is down: the next sync tried then
    std::array<std::mutex, 64> making_;  // a context being made holds making_[hash(id) % 64]
};

// Whether s can be a context id (letters, digits, '-', '_'; 1 to 64 of them).
bool valid_context_id(const std::string & s);
// The error for a context id that names nothing: 404 naming a well-formed id; 400 for a malformed
// one, not echoed (it may be huge or hold NULs). param: the request field or path part.
ApiError unknown_context(const std::string & id, const std::string & param);

}  // namespace kvlab::server
