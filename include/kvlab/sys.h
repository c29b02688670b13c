// System facts and hashing for provenance and measurement: SHA-256 (OpenSSL EVP), CPU and OS
// identification, process memory (RSS / peak RSS from /proc), and a steady clock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvlab {

// Streaming SHA-256. update() any number of times, then hex() once (lower-case, 64 chars).
class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256 &) = delete;
    Sha256 & operator=(const Sha256 &) = delete;

    void update(const void * data, size_t n);
    std::string hex();  // finalises; further update() calls are an error

private:
    void * md_ctx_;  // EVP_MD_CTX *
    bool done_ = false;
};

std::string sha256_hex(const void * data, size_t n);

// Hashes a file in 4 MiB chunks; throws Error("hash", ...) naming the path if it cannot be read.
std::string sha256_file(const std::string & path);

// sha256_file() memoised by (canonical path, size, mtime_ns) in cache_dir/hashes.json (the tools
// pass ~/.cache/kvlab or $KVLAB_CACHE; "" hashes without a cache). The cache file is rewritten
// atomically (tmp + rename); a corrupt or unreadable cache is ignored and rewritten. A file that
// changes while it is hashed is not cached. Cache I/O failures never fail the call: the hash is
// returned, just not stored.
std::string sha256_file_cached(const std::string & path, const std::string & cache_dir);

std::string cpu_model();  // "model name" from /proc/cpuinfo, "unknown" if absent
int n_cpus();             // CPUs this process may run on (affinity mask), at least 1
// The CPUs of n_cpus() that other work leaves free: the machine's busy time over a short
// sample of /proc/stat, rounded to whole cores, taken off n_cpus(); at least 1. Spinning
// threads on a core another process keeps busy make every barrier wait for a time slice
// (decode falls to a quarter of its single-thread speed), so the default thread count
// leaves such cores alone.
int idle_cpus(double sample_seconds = 0.1);

struct MemInfo {
    uint64_t rss_bytes;       // VmRSS
    uint64_t peak_rss_bytes;  // VmHWM: since process start or the last successful reset_peak_rss()
};
MemInfo mem_info();  // from /proc/self/status; throws Error("sys", ...) if unreadable

// Resets the peak RSS (VmHWM) to the current RSS by writing "5" to /proc/self/clear_refs, and checks
// that it took effect. If it fails, peak_rss_resettable() turns false and peaks are since process start.
void reset_peak_rss();
bool peak_rss_resettable();  // before any reset: whether /proc/self/clear_refs is writable

// How many more bytes this process may take before something refuses it: the least of the
// machine's MemAvailable (/proc/meminfo), its cgroup's memory.max less memory.current (cgroup
// v2), and the address-space and data limits (ulimit -v / -d) less what it uses now. `limit`
// names the bound that decided it.
struct MemoryRoom {
    uint64_t bytes;
    std::string limit;  // "MemAvailable", "cgroup memory.max", "ulimit -v", "ulimit -d"
};
MemoryRoom memory_room();
// Refuses, before anything is allocated, work that needs more bytes than memory_room():
// MemoryError: "[memory] <what> needs N bytes (X MiB); only M bytes (Y MiB) are available (limit)").
void require_memory(uint64_t bytes, const std::string & what);

// Asks the kernel to back the whole 4 KiB pages of [p, p + n) with transparent huge pages
// (madvise MADV_HUGEPAGE; Debian's default THP mode serves only such requests): for memory read end
// to end on every token (weights, KV rows), where 2 MiB pages save the TLB misses of 4 KiB ones.
// Advice only, never an error; call it before the memory is first written.
void advise_huge_pages(void * p, size_t n);

double now_seconds();  // steady clock, seconds since an arbitrary epoch

// s quoted for /bin/sh: 'it'\''s'.
std::string shell_quote(const std::string & s);

std::string hostname();
std::string os_release();  // PRETTY_NAME from /etc/os-release, "unknown" if absent

}  // namespace kvlab
