// The thread count that follows the machine's load (`-t 0`, the default).
//
// On a machine whose cores other processes keep busy, a thread that ggml parks on such a
// core makes every barrier of every graph wait for a time slice: with one busy process on
// 2 cores, 2 threads decode at a quarter of 1 thread's speed. So kvlab uses the cores the
// others leave idle, and looks again while it runs (a server, a long evaluation): the
// machine's busy time from /proc/stat minus this process's own CPU time is what the
// others used since the last look.
#pragma once

#include <cstdint>
#include <functional>

namespace kvlab {

// Cores other processes used over an interval, from two readings.
struct CpuReading {
    double wall_s = 0.0;         // steady clock
    uint64_t busy_jiffies = 0;   // the machine's, /proc/stat
    uint64_t total_jiffies = 0;  // busy + idle + iowait
    double own_cpu_s = 0.0;      // this process's CPU time (all its threads)
    double hz = 100.0;           // jiffies per second (sysconf(_SC_CLK_TCK))
    unsigned online = 1;         // CPUs the jiffies are summed over
    bool ok = false;             // /proc/stat was readable
};
CpuReading read_cpu();
// The cores (fractional) the machine spent on other processes between a and b: its busy time
// minus this process's own CPU time, over the wall time the jiffies span; 0 when either
// reading failed or no time passed.
double others_busy_cores(const CpuReading & a, const CpuReading & b);

// Where a tracker reads the machine: /proc and the steady clock, or a test's own figures.
struct CpuSource {
    std::function<CpuReading()> read = read_cpu;
    std::function<double()> now;  // seconds; empty: now_seconds()
    int n_cpus = 0;               // 0: n_cpus()
};

// Threads for the next computation: n_cpus() minus the cores the others kept busy over the
// last interval (rounded), at least 1. Reads /proc/stat at most once per interval_s, so a
// call costs a clock read between samples. Not thread-safe: one owner (the model).
class IdleCpuTracker {
public:
    IdleCpuTracker(int initial, double interval_s = 0.25, CpuSource source = {});
    int threads();                            // re-samples when interval_s has passed
    int current() const { return n_; }        // the last answer
    int changes() const { return changes_; }  // how often the answer changed

private:
    double now() const;
    CpuSource source_;
    double interval_s_;
    int n_;
    int changes_ = 0;
    CpuReading last_;
};

}  // namespace kvlab
