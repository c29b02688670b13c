// SHA-256 (OpenSSL EVP) with a file-hash cache, system facts from /proc and /etc, a steady
// clock, and peak-RSS reset.
#include "kvlab/sys.h"

#include <openssl/evp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "kvlab/cpu_share.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {

std::string trim(const std::string & s) {
    const size_t b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    const size_t e = s.find_last_not_of(" \t\r\n");
    return s.substr(b, e - b + 1);
}

// Value of the first "key<sep>value" line of a file, trimmed; empty if absent.
std::string find_field(const std::string & path, const std::string & key, char sep) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        const size_t p = line.find(sep);
        if (p == std::string::npos) continue;
        if (trim(line.substr(0, p)) == key) return trim(line.substr(p + 1));
    }
    return "";
}

uint64_t kb_field_bytes(const std::string & status, const char * key) {
    const size_t p = status.find(key);
    if (p == std::string::npos) throw Error("sys", std::string("no ") + key + " in /proc/self/status");
    return std::stoull(status.substr(p + std::char_traits<char>::length(key))) * 1024;  // "  1234 kB"
}

// -1: no reset attempted yet, 0: the last reset failed, 1: the last reset worked.
std::atomic<int> g_peak_reset_state{-1};

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

std::string cache_dir() {
    if (const char * c = std::getenv("KVLAB_CACHE"); c && *c) return c;
    const char * home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/kvlab";
}

std::string sha256_file_cached(const std::string & path) {
    const FileStamp before = stamp_of(path);
    std::error_code ec;
    std::string key = std::filesystem::canonical(path, ec).string();
    if (ec) key = std::filesystem::absolute(path).string();

    const std::string file = cache_dir() + "/hashes.json";
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

std::string cpu_model() {
    std::string m = find_field("/proc/cpuinfo", "model name", ':');
    if (m.empty()) m = find_field("/proc/cpuinfo", "Hardware", ':');  // some ARM kernels
    return m.empty() ? "unknown" : m;
}

int n_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? int(n) : 1;
}

int idle_cpus(double sample_seconds) {
    const int n = n_cpus();
    const CpuReading a = read_cpu();
    std::this_thread::sleep_for(std::chrono::duration<double>(sample_seconds));
    const int busy = int(std::lround(others_busy_cores(a, read_cpu())));
    return std::clamp(n - busy, 1, n);
}

std::string shell_quote(const std::string & s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

MemInfo mem_info() {
    std::ifstream in("/proc/self/status");
    if (!in) throw Error("sys", "cannot read /proc/self/status");
    const std::string status((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return MemInfo{kb_field_bytes(status, "VmRSS:"), kb_field_bytes(status, "VmHWM:")};
}

void reset_peak_rss() {
    bool ok = false;
    {
        std::ofstream out("/proc/self/clear_refs");
        out << "5";
        out.flush();
        ok = bool(out);
    }
    if (ok) {
        // Some kernels (or sandboxes) accept the write but do not reset VmHWM: check that the peak
        // now sits at the current RSS (slack for allocations racing with this check).
        const MemInfo m = mem_info();
        ok = m.peak_rss_bytes <= m.rss_bytes + (16u << 20);
    }
    g_peak_reset_state.store(ok ? 1 : 0);
}

bool peak_rss_resettable() {
    const int s = g_peak_reset_state.load();
    if (s >= 0) return s == 1;
    return access("/proc/self/clear_refs", W_OK) == 0;
}

void advise_huge_pages(void * p, size_t n) {
    const auto base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t page = 4096, begin = (base + page - 1) / page * page, end = (base + n) / page * page;
    if (p && end > begin) madvise(reinterpret_cast<void *>(begin), end - begin, MADV_HUGEPAGE);
}

double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string hostname() {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
    return buf;
}

std::string os_release() {
    for (const char * path : {"/etc/os-release", "/usr/lib/os-release"}) {
        std::string v = find_field(path, "PRETTY_NAME", '=');
        if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
            v = v.substr(1, v.size() - 2);
        }
        if (!v.empty()) return v;
    }
    return "unknown";
}

}  // namespace kvlab
