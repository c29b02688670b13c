// Facts about the machine for the provenance records: CPU model and count, idle CPUs, host and OS.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "kvlab/cpu_share.h"
#include "kvlab/sys.h"

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

}  // namespace

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
