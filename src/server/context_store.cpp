#include "server/context_store.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "server/api_error.h"

namespace kvlab::server {

namespace fs = std::filesystem;

std::string new_context_id() {
    static std::mutex mu;
    static std::mt19937_64 rng{std::random_device{}()};
    std::lock_guard<std::mutex> lock(mu);
    char b[32];
    std::snprintf(b, sizeof(b), "ctx-%016llx", static_cast<unsigned long long>(rng()));
    return b;
}

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

ContextStore::ContextStore(const Model & model, const Tokenizer & tok, std::string dir, uint64_t kv_budget)
    : model_(model), tok_(tok), dir_(std::move(dir)), budget_(kv_budget) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (!fs::is_directory(dir_)) throw Error("serve", "cannot use the store folder " + dir_);
    const std::string sha = model.file_sha256();
    for (const auto & e : fs::directory_iterator(dir_)) {
        const std::string name = e.path().filename().string();
        if (name.find(".kvc.tmp-") != std::string::npos) {  // a writer that died: never a context
            fs::remove(e.path(), ec);
            continue;
        }
        if (e.path().extension() != ".kvc") continue;
        const std::string id = e.path().stem().string();
        try {
            CacheFileContent content;
            const nlohmann::json meta = read_cache_file_meta(e.path().string(), &content);
            if (meta["model"].value("sha256", "") != sha) {
                std::fprintf(stderr, "[serve] %s: made with another model (%s); not served\n", name.c_str(),
                             meta["model"].value("file", "?").c_str());
                continue;
            }
            if (!valid_context_id(id)) continue;
            // a context is its file's name; a copied or renamed file holds another id
            const std::string inside = content.context.value("id", "");
            if (inside != id) {
                std::fprintf(stderr, "[serve] %s: holds context '%s' (a copied or renamed file); not served\n",
                             name.c_str(), inside.c_str());
                continue;
            }
            auto entry = std::make_shared<Entry>();
            auto info = std::make_shared<ContextInfo>();
            info->id = id;
            info->path = e.path().string();
            info->text = content.text;
            info->tokens = content.tokens;
            info->object = content.context;
            info->before = context_before(content.context);
            info->prompt_text = content.text.empty() ? "" : tok_.context_text(info->before, content.text);
            entry->info = info;
            entries_[id] = entry;
        } catch (const Error & err) {
            std::fprintf(stderr, "[serve] skipping %s\n", err.what());
        }
    }
}

nlohmann::json ContextStore::object_of(const Entry & e) const {
    nlohmann::json j = e.info->object;
    j["resident"] = e.rows != nullptr;
    return j;
}

nlohmann::json ContextStore::add(KvStore rows, const CacheFileContent & content, nlohmann::json object) {
    const uint64_t bytes = rows.bytes();
    if (bytes > budget_)
        throw ApiError(400,
                       "the context's KV rows take " + std::to_string(bytes) + " bytes, more than the server's " +
                           "--kv-budget of " + std::to_string(budget_) + " bytes (compress it more)",
                       "ratio", "kv_budget_exceeded");
    const std::string id = new_context_id();
    const std::string path = dir_ + "/" + id + ".kvc";
    object["id"] = id;
    object["object"] = "context";
    object["created"] = int64_t(std::time(nullptr));
    CacheFileContent c = content;
    c.context = object;
    object["file_bytes"] = save_cache_file(path, model_, rows, c);  // the file's own copy lacks only this
    auto info = std::make_shared<ContextInfo>();
    info->id = id;
    info->path = path;
    info->text = content.text;
    info->tokens = content.tokens;
    info->object = object;
    info->before = context_before(object);
    info->prompt_text = content.text.empty() ? "" : tok_.context_text(info->before, content.text);
    auto entry = std::make_shared<Entry>();
    entry->info = info;
    entry->rows = std::make_shared<const KvStore>(std::move(rows));
    entry->bytes = bytes;
    std::lock_guard<std::mutex> lock(mu_);
    entry->last_used = ++clock_;
    entries_[id] = entry;
    drop_to_budget(id);
    return object_of(*entry);
}

std::shared_ptr<const ContextInfo> ContextStore::info(const std::string & id) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second->info;
}

std::shared_ptr<const ContextInfo> ContextStore::longest_prefix(const std::vector<int32_t> & tokens) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<const ContextInfo> best;
    for (const auto & [id, e] : entries_) {
        const std::vector<int32_t> & t = e->info->tokens;
        if (t.empty() || t.size() >= tokens.size() || (best && t.size() <= best->tokens.size())) continue;
        if (std::equal(t.begin(), t.end(), tokens.begin())) best = e->info;
    }
    return best;
}

std::shared_ptr<const ContextInfo> ContextStore::longest_prefix(const std::string & chat_text) const {
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
            return load_cache_file(e->info->path, model_, 0);
        } catch (const Error & err) {  // the server's fault, not the client's: logged with the path, not sent
            std::fprintf(stderr, "[serve] context %s: %s\n", id.c_str(), err.what());
            throw ApiError(500, "the stored context '" + id + "' could not be read (the server's log says why)",
                           "context", "context_unreadable");
        }
    }();
    auto rows = std::make_shared<const KvStore>(std::move(f.cache));
    *load_s = now_seconds() - t0;
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

nlohmann::json ContextStore::describe(const std::string & id) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(id);
    return it == entries_.end() ? nlohmann::json() : object_of(*it->second);
}

nlohmann::json ContextStore::list() const {
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json data = nlohmann::json::array();
    for (const auto & [id, e] : entries_) data.push_back(object_of(*e));
    return {{"object", "list"}, {"data", data}};
}

bool ContextStore::remove(const std::string & id) {
    std::shared_ptr<Entry> e;
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto it = entries_.find(id);
        if (it == entries_.end()) return false;
        e = it->second;
        entries_.erase(it);
    }
    std::error_code ec;
    fs::remove(e->info->path, ec);
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

}  // namespace kvlab::server
