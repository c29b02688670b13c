// The process's memory: RSS and its peak (resettable between phases), huge-page advice.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

uint64_t kb_field_bytes(const std::string & status, const char * key) {
    const size_t p = status.find(key);
    if (p == std::string::npos) throw Error("sys", std::string("no ") + key + " in /proc/self/status");
    return std::stoull(status.substr(p + std::char_traits<char>::length(key))) * 1024;  // "  1234 kB"
}

// -1: no reset attempted yet, 0: the last reset failed, 1: the last reset worked.
std::atomic<int> g_peak_reset_state{-1};

}  // namespace

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

}  // namespace kvlab
