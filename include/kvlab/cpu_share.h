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

namespace kvlab {

// Cores other processes used over an interval, from two readings.
struct CpuReading {
    double wall_s = 0.0;         // steady clock
    uint64_t busy_jiffies = 0;   // the machine's, /proc/stat
    uint64_t total_jiffies = 0;  // busy + idle + iowait
    double own_cpu_s = 0.0;      // this process's CPU time (all its threads)
    bool ok = false;             // /proc/stat was readable
};
CpuReading read_cpu();
// The cores (fractional) the machine spent on other processes between a and b; 0 when
// either reading failed or no time passed.
double others_busy_cores(const CpuReading & a, const CpuReading & b);

// Threads for the next computation: n_cpus() minus the cores the others kept busy over the
// last interval (rounded), at least 1. Reads /proc/stat at most once per interval_s, so a
// call costs a clock read between samples. Not thread-safe: one owner (the model).
class IdleCpuTracker {
public:
    IdleCpuTracker(int initial, double interval_s = 0.25);
    int threads();                            // re-samples when interval_s has passed
    int current() const { return n_; }        // the last answer
    int changes() const { return changes_; }  // how often the answer changed

private:
    double interval_s_;
    int n_;
    int changes_ = 0;
    CpuReading last_;
};

}  // namespace kvlab
