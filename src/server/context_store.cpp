#include "server/context_store.h"

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "server/api_error.h"

namespace kvlab::server {

bool valid_context_id(const std::string & s) {
    if (s.empty() || s.size() > 64) return false;
    for (char c : s)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
    return true;
}

ApiError unknown_context(const std::string & id, const std::string & param) {
    if (!valid_context_id(id))
        return ApiError(400, "'" + param + "' must be a context id: 1 to 64 letters, digits, '-' or '_'", param,
                        "invalid_context_id");
    return ApiError(404, "no context '" + id + "'", param, "context_not_found");
}

ContextStore::ContextStore(const Model & model, const Tokenizer & tok, std::unique_ptr<ContextBackend> backend,
                           uint64_t kv_budget)
    : model_(model), tok_(tok), backend_(std::move(backend)), budget_(kv_budget) {
    generation_ = backend_->generation();
    for (StoredEntry & e : backend_->scan()) {
        const std::string id = e.id;
        entries_[id] = entry_of(std::move(e));
    }
}

std::shared_ptr<ContextStore::Entry> ContextStore::entry_of(StoredEntry e) const {
    auto info = std::make_shared<ContextInfo>();
    info->id = e.id;
    info->text = std::move(e.content.text);
    info->tokens = std::move(e.content.tokens);
    info->object = std::move(e.content.context);
    if (e.bytes > 0) info->object["file_bytes"] = e.bytes;  // the stored copy lacks only this
    info->before = context_before(info->object);
    info->prompt_text = info->text.empty() ? "" : tok_.context_text(info->before, info->text);
    auto entry = std::make_shared<Entry>();
    entry->info = info;
    return entry;
}

void ContextStore::sync() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (now_seconds() < next_retry_s_) return;
    }
    uint64_t g = 0, adds_before = 0;
    std::vector<StoredEntry> all;
    try {
        g = backend_->generation();
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (g == generation_) return;
            adds_before = adds_;
        }
        all = backend_->scan();
    } catch (const ApiError &) {  // the store is down: the index we have, tried again in a second
        std::lock_guard<std::mutex> lock(mu_);
        next_retry_s_ = now_seconds() + 1.0;
        return;
    }
    std::map<std::string, std::shared_ptr<Entry>> fresh;
    for (StoredEntry & e : all) {
        const std::string id = e.id;
        fresh[id] = entry_of(std::move(e));
    }
    std::lock_guard<std::mutex> lock(mu_);
    next_retry_s_ = 0.0;
    for (auto it = entries_.begin(); it != entries_.end();) {
        const auto f = fresh.find(it->first);
        if (f != fresh.end()) {
            fresh.erase(f);  // known here already (with its rows, when resident)
            ++it;
        } else if (it->second->added > adds_before) {
            ++it;  // added here after the scan began
        } else {
            it = entries_.erase(it);  // removed by another replica, or evicted
        }
    }
    for (auto & [id, e] : fresh) entries_[id] = e;
    generation_ = g;
}

nlohmann::json ContextStore::object_of(const Entry & e) const {
    nlohmann::json j = e.info->object;
    j["resident"] = e.rows != nullptr;
    return j;
}

nlohmann::json ContextStore::add(const std::string & id, KvStore rows, const CacheFileContent & content,
                                 nlohmann::json object) {
    const uint64_t bytes = rows.bytes();
    if (bytes > budget_)
        throw ApiError(400,
                       "the context's KV rows take " + std::to_string(bytes) + " bytes, more than the server's " +
                           "--kv-budget of " + std::to_string(budget_) + " bytes (compress it more)",
                       "ratio", "kv_budget_exceeded");
    object["id"] = id;
    object["object"] = "context";
    object["created"] = int64_t(std::time(nullptr));
    CacheFileContent c = content;
    c.context = object;
    object["file_bytes"] = backend_->put(id, rows, c);  // the stored copy lacks only this
    StoredEntry stored{id, CacheFileContent{content.text, content.tokens, object}, 0};
    std::shared_ptr<Entry> entry = entry_of(std::move(stored));
    entry->rows = std::make_shared<const KvStore>(std::move(rows));
    entry->bytes = bytes;
    std::lock_guard<std::mutex> lock(mu_);
    entry->last_used = ++clock_;
    entry->added = ++adds_;
    entries_[id] = entry;
    drop_to_budget(id);
    return object_of(*entry);
}

ContextStore::Making ContextStore::making(const std::string & id) {
    Making m;
    m.local = std::unique_lock<std::mutex>(making_[std::hash<std::string>{}(id) % making_.size()]);
    m.shared = backend_->lock(id);
    return m;
}

nlohmann::json ContextStore::existing(const std::string & id) {
    nlohmann::json j = describe(id);
    if (j.is_null()) {  // made by another replica since the last sync?
        if (std::optional<StoredEntry> e = backend_->find(id)) {
            std::shared_ptr<Entry> entry = entry_of(std::move(*e));
            std::lock_guard<std::mutex> lock(mu_);
            const auto it = entries_.emplace(id, entry).first;
            j = object_of(*it->second);
        }
    }
    return j;
}

void ContextStore::count_making(bool reused) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(reused ? make_hits_ : make_misses_);
}

std::shared_ptr<const ContextInfo> ContextStore::info(const std::string & id) {
    sync();  // made, or deleted, by another replica?
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second->info;
}

std::shared_ptr<const ContextInfo> ContextStore::longest_prefix(const std::vector<int32_t> & tokens) {
    sync();
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<const ContextInfo> best;
    for (const auto & [id, e] : entries_) {
        const std::vector<int32_t> & t = e->info->tokens;
        if (t.empty() || t.size() >= tokens.size() || (best && t.size() <= best->tokens.size())) continue;
        if (std::equal(t.begin(), t.end(), tokens.begin())) best = e->info;
    }
    return best;
}

std::shared_ptr<const ContextInfo> ContextStore::longest_prefix(const std::string & chat_text) {
    sync();
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<const ContextInfo> best;
    for (const auto & [id, e] : entries_) {
        const std::string & t = e->info->prompt_text;
        if (t.empty() || t.size() >= chat_text.size() || (best && t.size() <= best->prompt_text.size())) continue;
        if (chat_text.compare(0, t.size(), t) == 0) best = e->info;
    }
    return best;
}

std::shared_ptr<const KvStore> ContextStore::rows(const std::string & id, double * load_s) {
    *load_s = 0.0;
    std::shared_ptr<Entry> e;
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = entries_.find(id);
        if (it == entries_.end()) throw ApiError(404, "no context '" + id + "'", "context", "context_not_found");
        e = it->second;
        e->last_used = ++clock_;
        if (e->rows) return e->rows;
    }
    std::lock_guard<std::mutex> load(e->load);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (e->rows) return e->rows;  // another request read it meanwhile
    }
    const double t0 = now_seconds();
    LoadedCacheFile f = [&] {
        try {
            return backend_->get(id);
        } catch (const ApiError & err) {
            if (err.status == 404) {  // evicted or deleted elsewhere: no longer a context here either
                std::lock_guard<std::mutex> lock(mu_);
                const auto it = entries_.find(id);
                if (it != entries_.end() && it->second == e) entries_.erase(it);
            }
            throw;
        }
    }();
    auto rows = std::make_shared<const KvStore>(std::move(f.cache));
    *load_s = now_seconds() - t0;
    std::fprintf(stderr, "[serve] context %s: %.1f MB read from the store in %.3f s (fetch %.3f, checks %.3f, rows %.3f)\n",
                 id.c_str(), double(f.file_bytes) / 1e6, *load_s, f.read_s, f.verify_s, f.build_s);
    std::lock_guard<std::mutex> lock(mu_);
    e->rows = rows;
    e->bytes = rows->bytes();
    e->last_used = ++clock_;
    ++reloads_;
    drop_to_budget(id);
    return rows;
}

void ContextStore::drop_to_budget(const std::string & keep) {
    for (;;) {
        uint64_t total = 0;
        Entry * lru = nullptr;
        for (auto & [id, e] : entries_) {
            if (!e->rows) continue;
            total += e->bytes;
            if (id != keep && (!lru || e->last_used < lru->last_used)) lru = e.get();
        }
        if (total <= budget_ || !lru) return;
        lru->rows.reset();  // freed now, or when the last request answering from it ends
        lru->bytes = 0;
        ++drops_;
    }
}

nlohmann::json ContextStore::describe(const std::string & id) {
    if (!info(id)) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(id);
    return it == entries_.end() ? nlohmann::json() : object_of(*it->second);
}

nlohmann::json ContextStore::list() {
    sync();
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json data = nlohmann::json::array();
    for (const auto & [id, e] : entries_) data.push_back(object_of(*e));
    return {{"object", "list"}, {"data", data}};
}

bool ContextStore::remove(const std::string & id) {
    if (!info(id)) return false;  // (made by another replica: known after a sync)
    std::shared_ptr<Entry> e;
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = entries_.find(id);
        if (it == entries_.end()) return false;
        e = it->second;
    }
    backend_->remove(id);  // first: a store that cannot be reached keeps the context here too
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(id);
    if (it != entries_.end() && it->second == e) entries_.erase(it);
    return true;
}

uint64_t ContextStore::resident_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t n = 0;
    for (const auto & [id, e] : entries_) n += e->rows ? e->bytes : 0;
    return n;
}

size_t ContextStore::size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
}

size_t ContextStore::n_resident() const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto & [id, e] : entries_) n += e->rows != nullptr;
    return n;
}

uint64_t ContextStore::n_reloads() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reloads_;
}

uint64_t ContextStore::n_drops() const {
    std::lock_guard<std::mutex> lock(mu_);
    return drops_;
}

BackendCounts ContextStore::store_counts() const {
    BackendCounts c = backend_->counts();
    std::lock_guard<std::mutex> lock(mu_);
    c.hits += make_hits_;
    c.misses += make_misses_;
    return c;
}

}  // namespace kvlab::server
