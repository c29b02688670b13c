// SHA-256 (OpenSSL EVP), of memory and of files, with a cache of file hashes keyed by size and
// mtime in cache_dir().
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

struct FileStamp {
    uint64_t size;
    int64_t mtime_ns;
    bool operator==(const FileStamp &) const = default;
};

FileStamp stamp_of(const std::string & path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) throw Error("hash", "cannot read " + path + ": " + std::strerror(errno));
    return FileStamp{uint64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

nlohmann::json load_hash_cache(const std::string & file) {
    std::ifstream in(file);
    if (!in) return nlohmann::json::object();
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    return j.is_object() ? j : nlohmann::json::object();  // corrupt: start afresh
}

// The cached hash of key if its entry matches the stamp, else empty (malformed entries are misses).
std::string cached_hash(const nlohmann::json & cache, const std::string & key, const FileStamp & st) {
    const auto it = cache.find(key);
    if (it == cache.end() || !it->is_object()) return "";
    try {
        const nlohmann::json & e = *it;
        const std::string hex = e.at("sha256").get<std::string>();
        if (e.at("size").get<uint64_t>() == st.size && e.at("mtime_ns").get<int64_t>() == st.mtime_ns &&
            hex.size() == 64) {
            return hex;
        }
    } catch (const nlohmann::json::exception &) {
    }
    return "";
}

// Best effort: write to a unique tmp file in the same directory, then rename over the cache.
void store_hash_cache(const std::string & file, const nlohmann::json & j) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
    const std::string tmp = file + ".tmp." + std::to_string(getpid());
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << j.dump(1) << "\n";
        out.flush();
        if (!out) {
            std::remove(tmp.c_str());
            return;
        }
    }
    if (std::rename(tmp.c_str(), file.c_str()) != 0) std::remove(tmp.c_str());
}
}  // namespace

Sha256::Sha256() : md_ctx_(EVP_MD_CTX_new()) {
    if (!md_ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX *>(md_ctx_), EVP_sha256(), nullptr) != 1) {
        EVP_MD_CTX_free(static_cast<EVP_MD_CTX *>(md_ctx_));
        throw Error("hash", "OpenSSL could not initialise SHA-256");
    }
}

Sha256::~Sha256() {
    EVP_MD_CTX_free(static_cast<EVP_MD_CTX *>(md_ctx_));
}

void Sha256::update(const void * data, size_t n) {
    KVLAB_ASSERT(!done_, "Sha256::update after hex()");
    if (n > 0 && EVP_DigestUpdate(static_cast<EVP_MD_CTX *>(md_ctx_), data, n) != 1) {
        throw Error("hash", "OpenSSL SHA-256 update failed");
    }
}

std::string Sha256::hex() {
    KVLAB_ASSERT(!done_, "Sha256::hex called twice");
    done_ = true;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(static_cast<EVP_MD_CTX *>(md_ctx_), md, &len) != 1) {
        throw Error("hash", "OpenSSL SHA-256 final failed");
    }
    static const char * digits = "0123456789abcdef";
    std::string out(2 * len, '0');
    for (unsigned int i = 0; i < len; ++i) {
        out[2 * i] = digits[md[i] >> 4];
        out[2 * i + 1] = digits[md[i] & 15];
    }
    return out;
}

std::string sha256_hex(const void * data, size_t n) {
    Sha256 h;
    h.update(data, n);
    return h.hex();
}

std::string sha256_file(const std::string & path) {
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw Error("hash", "cannot read " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (fstat(fileno(f.get()), &st) == 0 && S_ISDIR(st.st_mode)) {
        throw Error("hash", "cannot read " + path + ": is a directory");
    }
    Sha256 h;
    std::vector<char> buf(size_t(4) << 20);
    size_t n = 0;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) h.update(buf.data(), n);
    if (std::ferror(f.get())) throw Error("hash", "error reading " + path + ": " + std::strerror(errno));
    return h.hex();
}

std::string sha256_file_cached(const std::string & path, const std::string & cache_dir) {
    if (cache_dir.empty()) return sha256_file(path);
    const FileStamp before = stamp_of(path);
    std::error_code ec;
    std::string key = std::filesystem::canonical(path, ec).string();
    if (ec) key = std::filesystem::absolute(path).string();

    const std::string file = cache_dir + "/hashes.json";
    nlohmann::json cache = load_hash_cache(file);
    if (std::string hit = cached_hash(cache, key, before); !hit.empty()) return hit;

    const std::string hex = sha256_file(path);
    if (stamp_of(path) == before) {     // unchanged while hashing: safe to cache
        cache = load_hash_cache(file);  // re-read: another process may have added entries meanwhile
        cache[key] = {{"size", before.size}, {"mtime_ns", before.mtime_ns}, {"sha256", hex}};
        store_hash_cache(file, cache);
    }
    return hex;
}

}  // namespace kvlab
