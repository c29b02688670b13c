#include "kvlab/cpu_share.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "kvlab/sys.h"

namespace kvlab {

CpuReading read_cpu() {
    CpuReading r;
    r.wall_s = now_seconds();
    timespec ts{};
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) == 0) r.own_cpu_s = double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    std::ifstream in("/proc/stat");
    std::string cpu;
    uint64_t v[8] = {};  // user nice system idle iowait irq softirq steal
    if (!(in >> cpu) || cpu != "cpu") return r;
    for (uint64_t & x : v)
        if (!(in >> x)) return r;
    r.busy_jiffies = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    r.total_jiffies = r.busy_jiffies + v[3] + v[4];
    r.hz = double(std::max(1L, sysconf(_SC_CLK_TCK)));
    r.online = std::max(1u, std::thread::hardware_concurrency());
    r.ok = true;
    return r;
}

double others_busy_cores(const CpuReading & a, const CpuReading & b) {
    if (!a.ok || !b.ok || b.total_jiffies <= a.total_jiffies) return 0.0;
    const double span_s = double(b.total_jiffies - a.total_jiffies) / b.hz / b.online;  // ~ wall time
    const double busy_s = double(b.busy_jiffies - a.busy_jiffies) / b.hz;
    const double others_s = busy_s - (b.own_cpu_s - a.own_cpu_s);
    return std::max(0.0, others_s / span_s);
}

IdleCpuTracker::IdleCpuTracker(int initial, double interval_s, CpuSource source)
    : source_(std::move(source)),
      interval_s_(interval_s),
      n_(std::clamp(initial, 1, source_.n_cpus > 0 ? source_.n_cpus : n_cpus())),
      last_(source_.read()) {}

double IdleCpuTracker::now() const {
    return source_.now ? source_.now() : now_seconds();
}

int IdleCpuTracker::threads() {
    if (now() - last_.wall_s < interval_s_) return n_;
    const CpuReading now = source_.read();
    if (!now.ok || !last_.ok) {
        last_ = now;
        return n_;
    }
    const int n = source_.n_cpus > 0 ? source_.n_cpus : n_cpus();
    const int busy = int(std::lround(others_busy_cores(last_, now)));
    const int want = std::clamp(n - busy, 1, n);
    if (want != n_) ++changes_;
    n_ = want;
    last_ = now;
    return n_;
}

}  // namespace kvlab
