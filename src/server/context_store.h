// The server's stored contexts: each one a cache file in the store folder (it survives a
// restart) and, while memory allows, its rows resident. The resident rows of all contexts
// stay under a byte budget: the least recently used are dropped from memory and read back
// from their files when a request needs them (the same rows: answers are identical).
#pragma once

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

namespace kvlab::server {

// What a request needs to build its prompt on a context, and the API object describing it.
struct ContextInfo {
    std::string id;
    std::string path;
    std::string text;                 // the context's text
    std::vector<ChatMessage> before;  // messages before it (a system message)
    std::vector<int32_t> tokens;      // its tokens: the rows' positions 0 .. n-1
    std::string prompt_text;          // the chat text they encode (Tokenizer::context_text; "" without a template)
    nlohmann::json object;            // the API object (GET /v1/contexts/{id}) without "resident"
};

class ContextStore {
public:
    // Registers every cache file in dir made with this model (others are listed on stderr
    // and left alone); their rows are read on first use.
    ContextStore(const Model & model, const Tokenizer & tok, std::string dir, uint64_t kv_budget);

    // Saves the context as dir/ID.kvc and keeps its rows resident. `object` is completed
    // with id, created and file bytes. Throws ApiError(400) when the rows alone exceed the
    // budget.
    nlohmann::json add(KvStore rows, const CacheFileContent & content, nlohmann::json object);
    // nullptr when there is no such context.
    std::shared_ptr<const ContextInfo> info(const std::string & id) const;
    // The stored context with the most tokens that are a proper prefix of `tokens` (at least one
    // token left after it); ties go to the earliest id. nullptr when none is.
    std::shared_ptr<const ContextInfo> longest_prefix(const std::vector<int32_t> & tokens) const;
    // The same by text: the context whose prompt_text is the longest proper prefix of a
    // conversation's rendered chat text (tokens may split differently at the boundary: a context
    // ending in newlines before "\n\nQuestion: ").
    std::shared_ptr<const ContextInfo> longest_prefix(const std::string & chat_text) const;
    // The rows, read back from the file when they had been dropped (load_s: the time that
    // took; 0 when resident). Throws ApiError(404) when the context is gone.
    std::shared_ptr<const KvStore> rows(const std::string & id, double * load_s);
    nlohmann::json describe(const std::string & id) const;  // null when unknown
    nlohmann::json list() const;
    bool remove(const std::string & id);

    uint64_t budget() const { return budget_; }
    uint64_t resident_bytes() const;
    size_t size() const;
    size_t n_resident() const;
    uint64_t n_reloads() const;
    uint64_t n_drops() const;
    const std::string & dir() const { return dir_; }

private:
    struct Entry {
        std::shared_ptr<const ContextInfo> info;
        std::shared_ptr<const KvStore> rows;  // null while dropped
        uint64_t bytes = 0;                   // the rows' allocation when resident
        uint64_t last_used = 0;               // a logical clock
        std::mutex load;                      // one reader of the file at a time
    };
    nlohmann::json object_of(const Entry & e) const;
    void drop_to_budget(const std::string & keep);  // under mu_

    const Model & model_;
    const Tokenizer & tok_;
    std::string dir_;
    uint64_t budget_;
    mutable std::mutex mu_;
    std::map<std::string, std::shared_ptr<Entry>> entries_;
    uint64_t clock_ = 0, reloads_ = 0, drops_ = 0;
};

// A fresh context id: "ctx-" and 16 hex digits.
std::string new_context_id();
// Whether s can be a context id (letters, digits, '-', '_'; 1 to 64 of them).
bool valid_context_id(const std::string & s);
// The error for a context id that names nothing: 404 naming a well-formed id; 400 for a malformed
// one, not echoed (it may be huge or hold NULs). param: the request field or path part.
ApiError unknown_context(const std::string & id, const std::string & param);

}  // namespace kvlab::server
