// memory_room() and require_memory() (kvlab/sys.h): the bytes a process may still take, read
// from the kernel's own accounting, so that work too big for the machine is refused with its
// size before an allocation fails deep inside ggml or the OOM killer ends the process.
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

constexpr uint64_t k_unlimited = std::numeric_limits<uint64_t>::max();

// The value in kB of "key:" in a /proc file of "key: value kB" lines, in bytes; k_unlimited if absent.
uint64_t proc_kb(const char * path, const std::string & key) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key, 0) == 0) {
            std::istringstream fields(line.substr(key.size()));
            uint64_t kb = 0;
            if (fields >> kb) return kb * 1024;
        }
    return k_unlimited;
}

// A cgroup v2 file of this process's cgroup holding one number ("max": k_unlimited).
uint64_t cgroup_value(const std::string & file) {
    std::ifstream self("/proc/self/cgroup");
    std::string line, dir;
    while (std::getline(self, line))
        if (line.rfind("0::", 0) == 0) dir = line.substr(3);
    if (dir.empty()) return k_unlimited;
    std::ifstream in("/sys/fs/cgroup" + dir + "/" + file);
    std::string v;
    if (!(in >> v) || v == "max") return k_unlimited;
    try {
        return std::stoull(v);
    } catch (const std::exception &) {
        return k_unlimited;
    }
}

// rlimit's soft limit less `used`, or k_unlimited.
uint64_t rlimit_room(int resource, uint64_t used) {
    rlimit rl{};
    if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return k_unlimited;
    return rl.rlim_cur > used ? rl.rlim_cur - used : 0;
}

std::string mib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f MiB", double(bytes) / (1024.0 * 1024.0));
    return buf;
}

}  // namespace

MemoryRoom memory_room() {
    MemoryRoom room{k_unlimited, "none"};
    auto consider = [&](uint64_t bytes, const char * limit) {
        if (bytes < room.bytes) room = {bytes, limit};
    };
    consider(proc_kb("/proc/meminfo", "MemAvailable:"), "MemAvailable");
    const uint64_t max = cgroup_value("memory.max"), current = cgroup_value("memory.current");
    if (max != k_unlimited && current != k_unlimited) consider(max > current ? max - current : 0, "cgroup memory.max");
    const uint64_t vm_size = proc_kb("/proc/self/status", "VmSize:");
    if (vm_size != k_unlimited) consider(rlimit_room(RLIMIT_AS, vm_size), "ulimit -v");
    const uint64_t vm_data = proc_kb("/proc/self/status", "VmData:");
    if (vm_data != k_unlimited) consider(rlimit_room(RLIMIT_DATA, vm_data), "ulimit -d");
    return room;
}

void require_memory(uint64_t bytes, const std::string & what) {
    const MemoryRoom room = memory_room();
    if (bytes <= room.bytes) return;
    throw MemoryError(what + " needs " + std::to_string(bytes) + " bytes (" + mib(bytes) + "); only " +
                      std::to_string(room.bytes) + " bytes (" + mib(room.bytes) + ") are available (" + room.limit +
                      ")");
}

}  // namespace kvlab
