// The folder store: each context a cache file DIR/ID.kvc, written atomically (a temporary file
// renamed over it), so a crash leaves no half-written context; one server process per folder.
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>

#include "kvlab/error.h"
#include "server/context_backend.h"
#include "server/context_store.h"

namespace kvlab::server {

namespace {

namespace fs = std::filesystem;

class FolderBackend final : public ContextBackend {
public:
    FolderBackend(std::string dir, const Model & model) : dir_(std::move(dir)), model_(model) {
        std::error_code ec;
        fs::create_directories(dir_, ec);
        if (!fs::is_directory(dir_)) throw Error("serve", "cannot use the store folder " + dir_);
    }

    std::string describe() const override { return "folder " + dir_; }

    std::vector<StoredEntry> scan() override {
        std::vector<StoredEntry> out;
        const std::string sha = model_.file_sha256();
        std::error_code ec;
        for (const auto & e : fs::directory_iterator(dir_)) {
            const std::string name = e.path().filename().string();
            if (name.find(".kvc.tmp-") != std::string::npos) {  // a writer that died: never a context
                fs::remove(e.path(), ec);
                continue;
            }
            if (e.path().extension() != ".kvc") continue;
            const std::string id = e.path().stem().string();
            try {
                StoredEntry s;
                const nlohmann::json meta = read_cache_file_meta(e.path().string(), &s.content);
                if (meta["model"].value("sha256", "") != sha) {
                    std::fprintf(stderr, "[serve] %s: made with another model (%s); not served\n", name.c_str(),
                                 meta["model"].value("file", "?").c_str());
                    continue;
                }
                if (!valid_context_id(id)) continue;
                // a context is its file's name; a copied or renamed file holds another id
                const std::string inside = s.content.context.value("id", "");
                if (inside != id) {
                    std::fprintf(stderr, "[serve] %s: holds context '%s' (a copied or renamed file); not served\n",
                                 name.c_str(), inside.c_str());
                    continue;
                }
                s.id = id;
                s.bytes = fs::file_size(e.path(), ec);
                out.push_back(std::move(s));
            } catch (const Error & err) {
                std::fprintf(stderr, "[serve] skipping %s\n", err.what());
            }
        }
        return out;
    }

    uint64_t generation() override { return 0; }

    std::optional<StoredEntry> find(const std::string & id) override {
        StoredEntry s;
        try {
            read_cache_file_meta(path(id), &s.content);
        } catch (const Error &) {
            return std::nullopt;
        }
        s.id = id;
        std::error_code ec;
        s.bytes = fs::file_size(path(id), ec);
        return s;
    }

    uint64_t put(const std::string & id, const KvStore & rows, const CacheFileContent & content) override {
        const uint64_t n = save_cache_file(path(id), model_, rows, content);
        std::lock_guard<std::mutex> lock(mu_);
        ++counts_.writes;
        counts_.bytes_written += n;
        return n;
    }

    LoadedCacheFile get(const std::string & id) override {
        if (!fs::exists(path(id))) {
            std::lock_guard<std::mutex> lock(mu_);
            ++counts_.misses;
            throw ApiError(404, "no context '" + id + "' (its file is gone)", "context", "context_not_found");
        }
        try {
            LoadedCacheFile f = load_cache_file(path(id), model_, 0);
            std::lock_guard<std::mutex> lock(mu_);
            ++counts_.hits;
            counts_.bytes_read += f.file_bytes;
            return f;
        } catch (const Error & err) {  // the server's fault, not the client's: logged with the path, not sent
            std::fprintf(stderr, "[serve] context %s: %s\n", id.c_str(), err.what());
            std::lock_guard<std::mutex> lock(mu_);
            ++counts_.errors;
            throw ApiError(500, "the stored context '" + id + "' could not be read (the server's log says why)",
                           "context", "context_unreadable");
        }
    }

    bool remove(const std::string & id) override {
        std::error_code ec;
        return fs::remove(path(id), ec);
    }

    std::unique_ptr<CreationLock> lock(const std::string &) override { return nullptr; }

    BackendCounts counts() const override {
        std::lock_guard<std::mutex> lock(mu_);
        return counts_;
    }

    bool healthy() const override { return true; }

private:
    std::string path(const std::string & id) const { return dir_ + "/" + id + ".kvc"; }

    std::string dir_;
    const Model & model_;
    mutable std::mutex mu_;
    BackendCounts counts_;
};

}  // namespace

std::unique_ptr<ContextBackend> open_folder_backend(const std::string & dir, const Model & model) {
    return std::make_unique<FolderBackend>(dir, model);
}

std::unique_ptr<ContextBackend> open_context_backend(const std::string & spec, const Model & model) {
    if (spec.rfind("redis://", 0) == 0) return open_redis_backend(spec, model);
    return open_folder_backend(spec, model);
}

ApiError store_unavailable(const std::string & store, const std::string & why) {
    return ApiError(503, "the shared context store (" + store + ") is unavailable: " + why, "context",
                    "store_unavailable");
}

}  // namespace kvlab::server
