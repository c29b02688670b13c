// The thread count that follows the machine's load: what other processes use counts, what this
// process uses does not (real processes and real /proc readings, no mocks).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "kvlab/cpu_share.h"
#include "kvlab/sys.h"

namespace kvlab {
namespace {

double others_over(double seconds) {
    const CpuReading a = read_cpu();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return others_busy_cores(a, read_cpu());
}

void spin_for(double seconds) {
    const double end = now_seconds() + seconds;
    volatile uint64_t x = 0;
    while (now_seconds() < end) x = x + 1;
}

// A child process that spins until killed.
struct Spinner {
    pid_t pid = fork();
    Spinner() {
        if (pid == 0) {
            volatile uint64_t x = 0;
            for (;;) x = x + 1;
        }
    }
    ~Spinner() {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
};

TEST(CpuShare, ReadsProcStat) {
    const CpuReading r = read_cpu();
    ASSERT_TRUE(r.ok);
    EXPECT_GT(r.total_jiffies, r.busy_jiffies);
}

TEST(CpuShare, OwnWorkIsNotOthers) {
    const double base = others_over(0.3);
    if (base > 0.3) GTEST_SKIP() << "other processes keep " << base << " cores busy: cannot isolate this one";
    const CpuReading a = read_cpu();
    spin_for(0.6);  // one core of this process's own work
    const double others = others_busy_cores(a, read_cpu());
    EXPECT_LT(others, base + 0.4) << "this process's own spinning counted as other work";
}

TEST(CpuShare, ABusyProcessIsSeenAndTheTrackerYieldsItsCore) {
    if (n_cpus() < 2) GTEST_SKIP() << "needs 2 CPUs";
    IdleCpuTracker tracker(n_cpus(), 0.4);
    Spinner spinner;
    ASSERT_GT(spinner.pid, 0);
    spin_for(0.5);  // this process busy too: its own time must be taken off
    EXPECT_GE(others_over(0.5), 0.6) << "a spinning child process not seen";
    EXPECT_LE(tracker.threads(), n_cpus() - 1);
    EXPECT_GE(tracker.changes(), 1);
}

TEST(CpuShare, TrackerKeepsItsAnswerWithinTheInterval) {
    IdleCpuTracker tracker(1, 3600.0);
    EXPECT_EQ(tracker.threads(), 1);
    EXPECT_EQ(tracker.changes(), 0);
}

}  // namespace
}  // namespace kvlab
