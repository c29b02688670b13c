// memory_room() and require_memory() (kvlab/sys.h): the bytes a process may still take, read
// from the kernel's own accounting, so that work too big for the machine is refused with its
// size before an allocation fails deep inside ggml or the OOM killer ends the process.
#include <sys/resource.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

constexpr uint64_t k_unlimited = std::numeric_limits<uint64_t>::max();

// The values in kB of the "key:" lines of a /proc file (in bytes; k_unlimited when absent), in
// the order of `keys`, from one read of the file.
template <size_t N>
std::array<uint64_t, N> proc_kb(const char * path, const std::array<const char *, N> & keys) {
    std::array<uint64_t, N> out;
    out.fill(k_unlimited);
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
        for (size_t i = 0; i < N; ++i)
            if (line.rfind(keys[i], 0) == 0) {
                std::istringstream fields(line.substr(std::strlen(keys[i])));
                uint64_t kb = 0;
                if (fields >> kb) out[i] = kb * 1024;
            }
    return out;
}

// This process's cgroup v2 directory, "" when there is none.
std::string cgroup_dir() {
    std::ifstream self("/proc/self/cgroup");
    std::string line;
    while (std::getline(self, line))
        if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
    return "";
}

// A cgroup v2 file holding one number ("max" or unreadable: k_unlimited).
uint64_t cgroup_value(const std::string & dir, const char * file) {
    std::ifstream in(dir + "/" + file);
    std::string v;
    if (dir.empty() || !(in >> v) || v == "max") return k_unlimited;
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
    consider(proc_kb<1>("/proc/meminfo", {"MemAvailable:"})[0], "MemAvailable");
    const std::string cg = cgroup_dir();
    const uint64_t max = cgroup_value(cg, "memory.max"), current = cgroup_value(cg, "memory.current");
    if (max != k_unlimited && current != k_unlimited) consider(max > current ? max - current : 0, "cgroup memory.max");
    const auto [vm_size, vm_data] = proc_kb<2>("/proc/self/status", {"VmSize:", "VmData:"});
    if (vm_size != k_unlimited) consider(rlimit_room(RLIMIT_AS, vm_size), "ulimit -v");
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
