// The thread count that follows the machine's load: what other processes use counts, what this
// process uses does not. /proc/stat as kvlab reads it, then the arithmetic and the tracker on
// readings given exactly (no sleeps, no spinning: the same answer on a busy CI machine).
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>

#include "kvlab/cpu_share.h"
#include "kvlab/sys.h"

namespace kvlab {
namespace {

TEST(CpuShare, ReadsProcStat) {
    const CpuReading r = read_cpu();
    ASSERT_TRUE(r.ok);
    EXPECT_GT(r.total_jiffies, r.busy_jiffies);
    EXPECT_GE(r.hz, 1.0);
    EXPECT_GE(r.online, 1u);
    EXPECT_GE(r.own_cpu_s, 0.0);
}

// A reading `dt` seconds after `a` on a machine of `online` CPUs at 100 jiffies per second: `busy`
// cores busy in all over that time, `own` of them this process's.
CpuReading after(const CpuReading & a, double dt, double busy, double own, unsigned online) {
    CpuReading b = a;
    b.wall_s += dt;
    b.total_jiffies += uint64_t(dt * 100.0 * online + 0.5);
    b.busy_jiffies += uint64_t(dt * 100.0 * busy + 0.5);
    b.own_cpu_s += dt * own;
    return b;
}

CpuReading start(unsigned online) {
    CpuReading r;
    r.hz = 100.0;
    r.online = online;
    r.total_jiffies = 1000000;
    r.busy_jiffies = 400000;
    r.ok = true;
    return r;
}

TEST(CpuShare, OthersAreTheMachinesBusyTimeLessThisProcesss) {
    const CpuReading a = start(4);
    EXPECT_DOUBLE_EQ(others_busy_cores(a, after(a, 2.0, 1.5, 0.5, 4)), 1.0);  // 1.5 busy, 0.5 ours
    EXPECT_DOUBLE_EQ(others_busy_cores(a, after(a, 2.0, 2.0, 2.0, 4)), 0.0);  // all ours
    EXPECT_DOUBLE_EQ(others_busy_cores(a, after(a, 1.0, 3.0, 0.0, 4)), 3.0);
    EXPECT_DOUBLE_EQ(others_busy_cores(a, after(a, 1.0, 1.0, 1.2, 4)), 0.0);  // never below 0
    EXPECT_DOUBLE_EQ(others_busy_cores(a, a), 0.0);                           // no time passed
    CpuReading failed = after(a, 1.0, 3.0, 0.0, 4);
    failed.ok = false;
    EXPECT_DOUBLE_EQ(others_busy_cores(a, failed), 0.0);
}

// Readings and a clock a test sets: the tracker on a 4-CPU machine.
struct Scripted {
    std::deque<CpuReading> readings;
    double clock = 0.0;
    CpuSource source() {
        return {[this] {
                    CpuReading r = readings.front();
                    if (readings.size() > 1) readings.pop_front();
                    return r;
                },
                [this] { return clock; }, 4};
    }
};

TEST(CpuShare, TheTrackerYieldsTheCoresOthersUseAndTakesThemBack) {
    Scripted m;
    const CpuReading r0 = start(4);
    const CpuReading r1 = after(r0, 0.25, 2.0, 1.0, 4);  // 1 other core busy
    const CpuReading r2 = after(r1, 0.25, 4.0, 1.0, 4);  // 3 others
    const CpuReading r3 = after(r2, 0.25, 4.0, 4.0, 4);  // only ours: every core ours again
    m.readings = {r0, r1, r2, r3};
    IdleCpuTracker t(4, 0.25, m.source());
    EXPECT_EQ(t.current(), 4);
    m.clock = r1.wall_s;
    EXPECT_EQ(t.threads(), 3);
    m.clock = r2.wall_s;
    EXPECT_EQ(t.threads(), 1);
    m.clock = r3.wall_s;
    EXPECT_EQ(t.threads(), 4);
    EXPECT_EQ(t.changes(), 3);
}

TEST(CpuShare, TheTrackerKeepsItsAnswerWithinTheInterval) {
    Scripted m;
    const CpuReading r0 = start(4);
    m.readings = {r0, after(r0, 1.0, 4.0, 0.0, 4)};  // every core busy with others, a second later
    IdleCpuTracker t(4, 1.0, m.source());
    m.clock = r0.wall_s + 0.99;
    EXPECT_EQ(t.threads(), 4);         // not read yet
    EXPECT_EQ(m.readings.size(), 1u);  // only the constructor's reading taken
    m.clock = r0.wall_s + 1.0;
    EXPECT_EQ(t.threads(), 1);  // at least one thread
    EXPECT_EQ(t.changes(), 1);
}

TEST(CpuShare, AFailedReadingKeepsTheLastAnswer) {
    Scripted m;
    const CpuReading r0 = start(4);
    CpuReading bad = after(r0, 0.5, 4.0, 0.0, 4);
    bad.ok = false;
    m.readings = {r0, bad};
    IdleCpuTracker t(2, 0.25, m.source());
    m.clock = bad.wall_s;
    EXPECT_EQ(t.threads(), 2);
    EXPECT_EQ(t.changes(), 0);
}

}  // namespace
}  // namespace kvlab
