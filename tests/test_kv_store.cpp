// KvStore (include/kvlab/cache.h) on synthetic shapes, no model: a ggml CPU backend and HParams
// written by hand, 2 layers x 3 KV heads x head_dim 8 (and 2 layers x 2 KV heads x head_dim 4
// with layer 0 a sliding-window layer of window 100, layer 1 global). Each operation
// (commit/rollback, reserve, compact, truncate, fit, slide, restore, copy) is checked against what
// the header promises: the positions of every segment, their K and V rows, next_pos(), the
// capacities, the layout (offsets, tensor shapes) and the byte accounting.
//
// Every element of every row is a function of (layer, head, position, element, K or V, salt):
// a multiple of 1/8 in [-128, 128], exact in F16, so a row taken from the wrong segment, position,
// layer or tensor (K for V) is caught. Contents are compared exactly: the F16 bits (read_rows) and
// the float32 values (read_k, read_v).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kvlab/cache.h"
#include "kvlab/error.h"
#include "kvlab/model.h"

namespace kvlab {
namespace {

using Positions = std::vector<std::vector<std::vector<int32_t>>>;  // [layer][head] ascending positions
using Caps = std::vector<std::vector<int64_t>>;                    // [layer][head] capacities

constexpr int32_t k_window = 100;  // the sliding layer's window in sliding_shape()

HParams shape(int n_layer, int n_head_kv, int head_dim) {
    HParams hp;
    hp.arch = "synthetic";
    hp.n_layer = n_layer;
    hp.n_head_kv = n_head_kv;
    hp.n_head = 2 * n_head_kv;
    hp.head_dim = head_dim;
    hp.n_embd = hp.n_head * head_dim;
    hp.n_rot = head_dim;
    return hp;
}

// 2 layers x 2 KV heads x head_dim 4; layer 0 slides (window k_window), layer 1 is global.
HParams sliding_shape() {
    HParams hp = shape(2, 2, 4);
    hp.n_swa = k_window;
    hp.swa_layers = {1, 0};
    return hp;
}

std::vector<int32_t> range(int32_t from, int32_t to) {  // from, from + 1, ..., to - 1
    std::vector<int32_t> r;
    for (int32_t x = from; x < to; ++x) r.push_back(x);
    return r;
}

// The same positions in every segment of an n_layer x n_head store.
Positions every(int n_layer, int n_head, const std::vector<int32_t> & pos) {
    return Positions(size_t(n_layer), std::vector<std::vector<int32_t>>(size_t(n_head), pos));
}

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Element e of the K (value false) or V row at position pos of segment (il, h), as written with
// salt: a multiple of 1/8 in [-128, 128] (at most 11 significant bits: exact in F16).
float element(int il, int h, int32_t pos, int e, bool value, uint64_t salt) {
    uint64_t x = mix(salt);
    x = mix(x ^ uint64_t(il));
    x = mix(x ^ uint64_t(h));
    x = mix(x ^ uint64_t(uint32_t(pos)));
    x = mix(x ^ uint64_t(e));
    x = mix(x ^ uint64_t(value));
    return float(int64_t(x % 2049) - 1024) / 8.0f;
}

// Writes every held row of every segment: the elements of its (layer, head, position).
void write_all(KvStore & s, uint64_t salt = 0) {
    const int d = s.head_dim();
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            for (bool value : {false, true}) {
                const std::vector<int32_t> & pos = s.positions(il, h);
                std::vector<ggml_fp16_t> rows(pos.size() * size_t(d));
                for (size_t r = 0; r < pos.size(); ++r)
                    for (int e = 0; e < d; ++e)
                        rows[r * size_t(d) + size_t(e)] = ggml_fp32_to_fp16(element(il, h, pos[r], e, value, salt));
                s.write_rows(il, h, value, rows.data());
            }
}

// n new tokens, as the engine appends them (its graph writes their rows after the held rows of
// every segment, then commit(n)): here commit(n), then the n new rows of each segment written
// through write_rows(), which rewrites the whole segment, so the earlier rows are read back
// first and written unchanged. The caller makes the room (reserve()).
void append(KvStore & s, int64_t n, uint64_t salt = 0) {
    s.commit(n);
    const int d = s.head_dim();
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            for (bool value : {false, true}) {
                const int64_t held = s.n_rows(il, h);
                const std::vector<int32_t> & pos = s.positions(il, h);
                std::vector<ggml_fp16_t> rows(size_t(held * d));
                s.read_rows(il, h, value, rows.data());
                for (int64_t r = held - n; r < held; ++r)
                    for (int e = 0; e < d; ++e)
                        rows[size_t(r * d + e)] = ggml_fp32_to_fp16(element(il, h, pos[size_t(r)], e, value, salt));
                s.write_rows(il, h, value, rows.data());
            }
}

// Every held row holds the elements of its (layer, head, position): read_rows' F16 bits, read_k's and
// read_v's floats, and read_k's row range (the second half of the segment).
::testing::AssertionResult rows_match(const KvStore & s, uint64_t salt = 0) {
    const int d = s.head_dim();
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h) {
            const std::vector<int32_t> & pos = s.positions(il, h);
            const int64_t n = s.n_rows(il, h);
            const std::vector<float> k = s.read_k(il, h), v = s.read_v(il, h);
            if (k.size() != size_t(n * d) || v.size() != size_t(n * d))
                return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": read_k/read_v gave "
                                                     << k.size() << "/" << v.size() << " floats for " << n << " rows";
            std::vector<ggml_fp16_t> raw(size_t(n * d));
            for (bool value : {false, true}) {
                s.read_rows(il, h, value, raw.data());
                const std::vector<float> & got = value ? v : k;
                for (int64_t r = 0; r < n; ++r)
                    for (int e = 0; e < d; ++e) {
                        const size_t i = size_t(r * d + e);
                        const float want = element(il, h, pos[size_t(r)], e, value, salt);
                        if (got[i] != want || raw[i] != ggml_fp32_to_fp16(want))
                            return ::testing::AssertionFailure()
                                   << "layer " << il << " head " << h << " row " << r << " (position " << pos[size_t(r)]
                                   << ") element " << e << " of " << (value ? "V" : "K") << ": " << got[i] << " (bits "
                                   << raw[i] << "), want " << want;
                    }
            }
            const int64_t row0 = n / 2;
            const std::vector<float> tail = s.read_k(il, h, row0, n - row0);
            if (!std::equal(tail.begin(), tail.end(), k.begin() + row0 * d, k.end()))
                return ::testing::AssertionFailure()
                       << "layer " << il << " head " << h << ": read_k of rows [" << row0 << ", " << n << ") differs";
        }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult positions_are(const KvStore & s, const Positions & want) {
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            if (s.positions(il, h) != want[size_t(il)][size_t(h)]) {
                auto f = ::testing::AssertionFailure() << "layer " << il << " head " << h << " holds positions {";
                for (int32_t x : s.positions(il, h)) f << " " << x;
                f << " }, want {";
                for (int32_t x : want[size_t(il)][size_t(h)]) f << " " << x;
                return f << " }";
            }
    return ::testing::AssertionSuccess();
}

::testing::AssertionResult capacities_are(const KvStore & s, const Caps & want) {
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            if (s.capacity(il, h) != want[size_t(il)][size_t(h)])
                return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": capacity "
                                                     << s.capacity(il, h) << ", want " << want[size_t(il)][size_t(h)];
    return ::testing::AssertionSuccess();
}

// After compact, truncate, fit and restore every segment holds "exactly its kept rows plus reserve":
// capacity == rows + reserve (an empty segment given no reserve may keep one row of room).
::testing::AssertionResult rows_plus_reserve(const KvStore & s, int64_t reserve) {
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h) {
            const int64_t want = s.n_rows(il, h) + reserve;
            if (s.capacity(il, h) != want && !(want == 0 && s.capacity(il, h) == 1))
                return ::testing::AssertionFailure()
                       << "layer " << il << " head " << h << ": capacity " << s.capacity(il, h) << " for "
                       << s.n_rows(il, h) << " rows and a reserve of " << reserve;
        }
    return ::testing::AssertionSuccess();
}

// What the header states of every store: the segments of layer il lie one after another, in head
// order, in the layer's [head_dim, rows] K and V tensors of the store's types (the plain [head_dim, cap, n_head_kv]
// block when capacities are equal); a segment holds at most its capacity, its positions ascending
// and below next_pos(); rows_per_segment() and total_rows() count the held rows; used_bytes() is
// their bytes (row_bytes() each), bytes() what the capacities take plus at most the alignment
// padding ggml gives each of the 2 x n_layer tensors.
::testing::AssertionResult layout_ok(const KvStore & s, ggml_backend * be) {
    const std::vector<std::vector<int64_t>> per_segment = s.rows_per_segment();
    if (per_segment.size() != size_t(s.n_layer())) return ::testing::AssertionFailure() << "rows_per_segment: layers";
    uint64_t cap_bytes = 0;
    int64_t held = 0;
    for (int il = 0; il < s.n_layer(); ++il) {
        if (per_segment[size_t(il)].size() != size_t(s.n_head_kv()))
            return ::testing::AssertionFailure() << "rows_per_segment: heads of layer " << il;
        int64_t rows = 0;
        for (int h = 0; h < s.n_head_kv(); ++h) {
            if (s.offset(il, h) != rows)
                return ::testing::AssertionFailure()
                       << "layer " << il << " head " << h << ": offset " << s.offset(il, h)
                       << ", the capacities of the heads before it add up to " << rows;
            const std::vector<int32_t> & pos = s.positions(il, h);
            if (s.n_rows(il, h) != int64_t(pos.size()) || per_segment[size_t(il)][size_t(h)] != s.n_rows(il, h) ||
                s.n_rows(il, h) > s.capacity(il, h))
                return ::testing::AssertionFailure()
                       << "layer " << il << " head " << h << ": n_rows " << s.n_rows(il, h) << ", positions "
                       << pos.size() << ", rows_per_segment " << per_segment[size_t(il)][size_t(h)] << ", capacity "
                       << s.capacity(il, h);
            for (size_t j = 0; j < pos.size(); ++j)
                if (pos[j] < 0 || pos[j] >= s.next_pos() || (j > 0 && pos[j] <= pos[j - 1]))
                    return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": position " << pos[j]
                                                         << " out of order or not below next_pos " << s.next_pos();
            rows += s.capacity(il, h);
            held += s.n_rows(il, h);
        }
        for (const ggml_tensor * t : {s.k(il), s.v(il)}) {
            const ggml_type want = t == s.k(il) ? s.types().k : s.types().v;
            if (t->type != want || t->ne[0] != s.head_dim() || t->ne[1] != rows)
                return ::testing::AssertionFailure()
                       << "layer " << il << ": tensor " << ggml_type_name(t->type) << " [" << t->ne[0] << ", "
                       << t->ne[1] << "], want " << ggml_type_name(want) << " [" << s.head_dim() << ", " << rows << "]";
        }
        cap_bytes += uint64_t(rows) * s.row_bytes();
    }
    if (s.total_rows() != held)
        return ::testing::AssertionFailure() << "total_rows " << s.total_rows() << ", segments hold " << held;
    if (s.used_bytes() != uint64_t(held) * s.row_bytes())
        return ::testing::AssertionFailure() << "used_bytes " << s.used_bytes() << " for " << held << " rows";
    const uint64_t pad = 2 * uint64_t(s.n_layer()) * (ggml_backend_get_alignment(be) - 1);
    if (s.bytes() < cap_bytes || s.bytes() > cap_bytes + pad)
        return ::testing::AssertionFailure()
               << "bytes " << s.bytes() << ", capacities take " << cap_bytes << " (+ at most " << pad << " of padding)";
    if (s.used_bytes() > s.bytes()) return ::testing::AssertionFailure() << "used_bytes above bytes";
    return ::testing::AssertionSuccess();
}

// Every segment's K and V halves as stored.
std::vector<std::vector<ggml_fp16_t>> raw_rows(const KvStore & s) {
    std::vector<std::vector<ggml_fp16_t>> out;
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            for (bool value : {false, true}) {
                out.emplace_back(size_t(s.n_rows(il, h) * s.head_dim()));
                s.read_rows(il, h, value, out.back().data());
            }
    return out;
}

Positions positions_of(const KvStore & s) {
    Positions p(size_t(s.n_layer()));
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h) p[size_t(il)].push_back(s.positions(il, h));
    return p;
}

class KvStoreTest : public ::testing::Test {
protected:
    void SetUp() override {
        be_.reset(ggml_backend_cpu_init());
        ASSERT_TRUE(be_ != nullptr);
    }
    ggml_backend * be() const { return be_.get(); }

    ggml_backend_ptr be_;  // outlives the stores of a test (they hold it, not owned)
    const HParams hp_ = shape(2, 3, 8);
};

TEST_F(KvStoreTest, NewStoreHasEmptySegmentsOfTheirCapacities) {
    KvStore s(hp_, be(), 5);  // every segment 5 rows
    EXPECT_EQ(s.n_layer(), 2);
    EXPECT_EQ(s.n_head_kv(), 3);
    EXPECT_EQ(s.head_dim(), 8);
    EXPECT_EQ(s.next_pos(), 0);
    EXPECT_EQ(s.total_rows(), 0);
    EXPECT_EQ(s.used_bytes(), 0u);
    EXPECT_EQ(s.row_bytes(), 2u * 8u * sizeof(ggml_fp16_t));  // K and V of one row of one head
    EXPECT_TRUE(capacities_are(s, {{5, 5, 5}, {5, 5, 5}}));
    EXPECT_TRUE(positions_are(s, every(2, 3, {})));
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_TRUE(s.layer_uniform(0));
    EXPECT_TRUE(s.uniform());

    // one capacity per segment: layer 0's tensors hold 2 + 7 + 3 rows, layer 1's 4 + 1 + 6
    KvStore t(hp_, be(), Caps{{2, 7, 3}, {4, 1, 6}});
    EXPECT_TRUE(capacities_are(t, {{2, 7, 3}, {4, 1, 6}}));
    EXPECT_EQ(t.offset(0, 2), 9);
    EXPECT_EQ(t.offset(1, 1), 4);
    EXPECT_TRUE(layout_ok(t, be()));
    EXPECT_FALSE(t.layer_uniform(0));  // the same (no) positions, but unequal capacities: not one block
    EXPECT_TRUE(t.uniform());          // every segment holds the same positions
}

TEST_F(KvStoreTest, CommitAppendsAtNextPositionsAndRollbackUndoesIt) {
    KvStore s(hp_, be(), 8);
    append(s, 5);
    EXPECT_EQ(s.next_pos(), 5);
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 5))));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    append(s, 3);  // full
    EXPECT_EQ(s.next_pos(), 8);
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 8))));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(s.uniform());

    s.rollback(3);
    EXPECT_EQ(s.next_pos(), 5);
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 5))));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_FALSE(s.lost_rows());  // nothing slides in a store without sliding layers
    append(s, 2);                 // continues at 5
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 7))));
    EXPECT_TRUE(rows_match(s));
}

TEST_F(KvStoreTest, ReserveGrowsOnlyFullSegmentsKeepingTheirRows) {
    KvStore s(hp_, be(), Caps{{4, 8, 4}, {6, 4, 10}});
    append(s, 4);  // segments of capacity 4 are full

    s.reserve(0);
    EXPECT_TRUE(capacities_are(s, {{4, 8, 4}, {6, 4, 10}}));
    // need 5 rows: the full ones grow to max(5, 1.5 x 4) = 6, the others keep their capacity
    s.reserve(1);
    EXPECT_TRUE(capacities_are(s, {{6, 8, 6}, {6, 6, 10}}));
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 4))));
    EXPECT_EQ(s.next_pos(), 4);
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    // need 10: capacity 6 -> max(10, 9) = 10, capacity 8 -> max(10, 12) = 12, 10 is enough
    s.reserve(6);
    EXPECT_TRUE(capacities_are(s, {{10, 12, 10}, {10, 10, 10}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    const uint64_t bytes = s.bytes();
    s.reserve(6);  // the room is there: nothing changes
    EXPECT_TRUE(capacities_are(s, {{10, 12, 10}, {10, 10, 10}}));
    EXPECT_EQ(s.bytes(), bytes);

    append(s, 6);  // fills the room made
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 10))));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
}

TEST_F(KvStoreTest, CompactKeepsThePlannedRowsOfEachSegment) {
    KvStore s(hp_, be(), 16);
    append(s, 12);  // positions 0..11: row index == position
    const uint64_t full_bytes = s.bytes();

    // different rows per head in layer 0 (one head keeps none, one keeps all), the same in layer 1
    const KeepPlan a = {{{0, 3, 4, 11}, {}, range(0, 12)}, {{1, 2, 7, 8, 10}, {1, 2, 7, 8, 10}, {1, 2, 7, 8, 10}}};
    s.compact(a, 3);
    EXPECT_TRUE(positions_are(s, a));
    EXPECT_EQ(s.next_pos(), 12);  // compaction never changes where the next token goes
    EXPECT_TRUE(capacities_are(s, {{7, 3, 15}, {8, 8, 8}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_LT(s.bytes(), full_bytes);
    EXPECT_FALSE(s.layer_uniform(0));
    EXPECT_TRUE(s.layer_uniform(1));
    EXPECT_FALSE(s.uniform());

    append(s, 2);  // positions 12, 13 after the kept rows of every segment
    EXPECT_TRUE(positions_are(s, {{{0, 3, 4, 11, 12, 13}, {12, 13}, range(0, 14)},
                                  {{1, 2, 7, 8, 10, 12, 13}, {1, 2, 7, 8, 10, 12, 13}, {1, 2, 7, 8, 10, 12, 13}}}));
    EXPECT_TRUE(rows_match(s));

    // a plan names rows of the segment as it is now, not positions
    const KeepPlan b = {{{1, 3, 5}, {1}, {0, 13}}, {{2, 4, 6}, {2, 4, 6}, {2, 4, 6}}};
    s.compact(b, 0);
    EXPECT_TRUE(positions_are(s, {{{3, 11, 13}, {13}, {0, 13}}, {{7, 10, 13}, {7, 10, 13}, {7, 10, 13}}}));
    EXPECT_EQ(s.next_pos(), 14);
    EXPECT_TRUE(capacities_are(s, {{3, 1, 2}, {3, 3, 3}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_TRUE(s.layer_uniform(1));

    // nothing kept, room for 2
    s.compact(KeepPlan(2, std::vector<std::vector<int32_t>>(3)), 2);
    EXPECT_EQ(s.total_rows(), 0);
    EXPECT_TRUE(rows_plus_reserve(s, 2));
    EXPECT_TRUE(layout_ok(s, be()));
    append(s, 1);
    EXPECT_TRUE(positions_are(s, every(2, 3, {14})));
    EXPECT_TRUE(rows_match(s));
}

TEST_F(KvStoreTest, CompactRefusesMalformedPlansAndKeepsTheStore) {
    KvStore s(hp_, be(), 4);
    append(s, 4);
    const KeepPlan all(2, std::vector<std::vector<int32_t>>(3, range(0, 4)));
    auto with = [&](int il, int h, std::vector<int32_t> rows) {
        KeepPlan p = all;
        p[size_t(il)][size_t(h)] = std::move(rows);
        return p;
    };
    EXPECT_THROW(s.compact(KeepPlan(1, std::vector<std::vector<int32_t>>(3)), 0), Error);  // 1 layer of 2
    EXPECT_THROW(s.compact(KeepPlan(3, std::vector<std::vector<int32_t>>(3)), 0), Error);  // 3 layers of 2
    KeepPlan two_heads = all;
    two_heads[1].pop_back();
    EXPECT_THROW(s.compact(two_heads, 0), Error);           // 2 heads of 3
    EXPECT_THROW(s.compact(with(0, 1, {0, 4}), 0), Error);  // row 4 of 4
    EXPECT_THROW(s.compact(with(1, 2, {-1, 2}), 0), Error);
    EXPECT_THROW(s.compact(with(0, 0, {2, 1}), 0), Error);  // not ascending
    EXPECT_THROW(s.compact(with(1, 0, {1, 1}), 0), Error);  // repeated
    EXPECT_THROW(s.compact(all, -1), Error);                // negative reserve
    // a refused plan leaves the store as it was
    EXPECT_EQ(s.next_pos(), 4);
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 4))));
    EXPECT_TRUE(capacities_are(s, {{4, 4, 4}, {4, 4, 4}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
}

TEST_F(KvStoreTest, TruncateDropsTheRowsFromAPositionOn) {
    KvStore s(hp_, be(), 10);
    append(s, 10);
    s.compact({{{0, 2, 4, 6, 8}, {1, 3, 5, 7, 9}, range(0, 10)}, {{9}, {}, {0, 1, 2}}}, 0);

    s.truncate(5, 2);  // positions >= 5 go; the next token takes position 5
    EXPECT_EQ(s.next_pos(), 5);
    EXPECT_TRUE(positions_are(s, {{{0, 2, 4}, {1, 3}, range(0, 5)}, {{}, {}, {0, 1, 2}}}));
    EXPECT_TRUE(capacities_are(s, {{5, 4, 7}, {2, 2, 5}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    append(s, 1);
    EXPECT_TRUE(positions_are(s, {{{0, 2, 4, 5}, {1, 3, 5}, range(0, 6)}, {{5}, {5}, {0, 1, 2, 5}}}));
    EXPECT_TRUE(rows_match(s));

    s.truncate(6, 0);  // at next_pos: every row stays, the room goes
    EXPECT_EQ(s.next_pos(), 6);
    EXPECT_TRUE(positions_are(s, {{{0, 2, 4, 5}, {1, 3, 5}, range(0, 6)}, {{5}, {5}, {0, 1, 2, 5}}}));
    EXPECT_TRUE(capacities_are(s, {{4, 3, 6}, {1, 1, 4}}));
    EXPECT_TRUE(rows_match(s));

    EXPECT_THROW(s.truncate(7, 0), Error);  // beyond next_pos
    EXPECT_THROW(s.truncate(-1, 0), Error);
    EXPECT_EQ(s.next_pos(), 6);
    EXPECT_EQ(s.total_rows(), 4 + 3 + 6 + 1 + 1 + 4);

    s.truncate(0, 1);  // everything
    EXPECT_EQ(s.next_pos(), 0);
    EXPECT_EQ(s.total_rows(), 0);
    EXPECT_TRUE(rows_plus_reserve(s, 1));
    EXPECT_TRUE(layout_ok(s, be()));
    append(s, 1);
    EXPECT_TRUE(positions_are(s, every(2, 3, {0})));
    EXPECT_TRUE(rows_match(s));
}

TEST_F(KvStoreTest, FitKeepsEveryRowWithTheReserve) {
    KvStore s(hp_, be(), 64);
    append(s, 6);
    const uint64_t big = s.bytes();
    s.fit(3);
    EXPECT_TRUE(capacities_are(s, {{9, 9, 9}, {9, 9, 9}}));
    EXPECT_TRUE(positions_are(s, every(2, 3, range(0, 6))));
    EXPECT_EQ(s.next_pos(), 6);
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_LT(s.bytes(), big);

    const KeepPlan uneven = {{{0, 5}, {1, 2, 3}, range(0, 6)}, {{4}, range(0, 6), {2, 3}}};
    s.compact(uneven, 40);
    s.fit(0);
    EXPECT_TRUE(positions_are(s, uneven));  // positions were 0..5: the kept rows' positions are their indices
    EXPECT_TRUE(capacities_are(s, {{2, 3, 6}, {1, 6, 2}}));
    EXPECT_EQ(s.next_pos(), 6);
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
}

TEST_F(KvStoreTest, SlideFreesWholeUnitsOfRowsNoQuerySees) {
    // Decoding 31 batches of 64 tokens into layer 0 (window 100) and layer 1 (global), sliding
    // after each as the engine does; the positions layer 0 should hold are computed from the
    // header's rule: rows at x <= next_pos - window are dead, slide() frees them in whole units of
    // k_slide_rows from the front of each segment.
    KvStore s(sliding_shape(), be(), 1);
    constexpr int64_t batch = 64;
    constexpr int64_t unit = KvStore::k_slide_rows;
    ASSERT_EQ(s.window(0), k_window);
    ASSERT_EQ(s.window(1), 0);
    EXPECT_EQ(s.max_window_rows(0, batch), k_window - 1 + unit - 1 + batch);
    EXPECT_EQ(s.max_window_rows(1, batch), -1);  // no bound on a global layer

    s.reserve(31 * batch, batch);
    for (int h = 0; h < 2; ++h) {
        EXPECT_LE(s.capacity(0, h), s.max_window_rows(0, batch));  // a sliding layer's room is bounded
        EXPECT_GE(s.capacity(1, h), 31 * batch);
    }
    std::vector<int32_t> slid;  // what layer 0 should hold
    for (int step = 0; step < 31; ++step) {
        for (int il = 0; il < 2; ++il)
            for (int h = 0; h < 2; ++h) ASSERT_LE(s.n_rows(il, h) + batch, s.capacity(il, h)) << "step " << step;
        append(s, batch);
        for (int64_t i = 0; i < batch; ++i) slid.push_back(s.next_pos() - int32_t(batch - i));
        s.slide();
        const int64_t dead =
            std::count_if(slid.begin(), slid.end(), [&](int32_t x) { return x <= s.next_pos() - k_window; });
        slid.erase(slid.begin(), slid.begin() + dead / unit * unit);
        for (int h = 0; h < 2; ++h) {
            ASSERT_EQ(s.positions(0, h), slid) << "step " << step;
            ASSERT_EQ(s.positions(1, h), range(0, s.next_pos())) << "step " << step;
            EXPECT_LE(s.n_rows(0, h), k_window - 1 + unit - 1) << "step " << step;
        }
        ASSERT_TRUE(rows_match(s)) << "step " << step;  // the rows moved to the front of the segment
        ASSERT_TRUE(layout_ok(s, be())) << "step " << step;
    }
    // slid at next_pos 640, 1152 and 1664: layer 0 keeps 1536..1983
    EXPECT_EQ(s.next_pos(), 31 * batch);
    EXPECT_EQ(s.positions(0, 0), range(1536, int32_t(31 * batch)));
    EXPECT_TRUE(s.layer_uniform(0));
    EXPECT_FALSE(s.uniform());
}

TEST_F(KvStoreTest, HoldAllRowsStopsSliding) {
    KvStore s(sliding_shape(), be(), 700);
    s.hold_all_rows(true);
    EXPECT_TRUE(s.holds_all_rows());
    EXPECT_EQ(s.max_window_rows(0, 64), -1);  // no bound while every row is held
    append(s, 700);                           // 601 rows at x <= 600 are dead on layer 0
    s.slide();
    EXPECT_TRUE(positions_are(s, every(2, 2, range(0, 700))));
    EXPECT_TRUE(rows_match(s));

    s.hold_all_rows(false);
    EXPECT_FALSE(s.holds_all_rows());
    s.slide();  // one unit of 512 of the 601 dead rows
    EXPECT_TRUE(positions_are(s, {{range(512, 700), range(512, 700)}, {range(0, 700), range(0, 700)}}));
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
}

TEST_F(KvStoreTest, FullRowsIsWhatAFullSlidingStoreHolds) {
    // full_rows(L): L per global segment; on a sliding one what slide() leaves of an L-token
    // context (the first whole units of dead rows freed). Compared with a store that committed L
    // tokens and slid.
    for (int64_t L : {0, 1, 99, 100, 610, 611, 640, 1122, 1123, 1200}) {
        KvStore s(sliding_shape(), be(), std::max<int64_t>(L, 1));
        s.commit(L);
        s.slide();
        EXPECT_EQ(s.full_rows(L), s.total_rows()) << "L = " << L;
        KvStore g(hp_, be(), 1);  // no sliding layer: every row of every segment
        EXPECT_EQ(g.full_rows(L), L * 2 * 3) << "L = " << L;
    }
    KvStore s(sliding_shape(), be(), 1);
    EXPECT_EQ(s.full_rows(1200), (1200 - 2 * 512) * 2 + 1200 * 2);  // layer 0 freed two units
}

TEST_F(KvStoreTest, RollbackPastSlidRowsLosesThem) {
    KvStore s(sliding_shape(), be(), 800);
    s.commit(700);
    s.slide();  // layer 0 frees positions 0..511
    ASSERT_EQ(s.positions(0, 0), range(512, 700));
    EXPECT_FALSE(s.lost_rows());
    s.rollback(89);  // next_pos 611: the next query sees x > 511, none of the freed rows
    EXPECT_EQ(s.next_pos(), 611);
    EXPECT_FALSE(s.lost_rows());
    EXPECT_TRUE(positions_are(s, {{range(512, 611), range(512, 611)}, {range(0, 611), range(0, 611)}}));
    s.rollback(1);  // next_pos 610: the query at 610 would see position 511, freed
    EXPECT_TRUE(s.lost_rows());

    KvStore t(sliding_shape(), be(), 800);  // the same rollback without a slide before it
    t.commit(700);
    t.rollback(90);
    EXPECT_FALSE(t.lost_rows());
}

TEST_F(KvStoreTest, RestoreHoldsTheSavedPositionsWithTheReserve) {
    const Positions saved = {{{0, 5, 9}, {}, {2}}, {{1, 2, 3}, {4}, {0, 8, 11}}};
    KvStore s = KvStore::restore(hp_, be(), saved, 12, 2);
    EXPECT_TRUE(positions_are(s, saved));
    EXPECT_EQ(s.next_pos(), 12);
    EXPECT_TRUE(capacities_are(s, {{5, 2, 3}, {5, 3, 5}}));
    EXPECT_TRUE(layout_ok(s, be()));
    write_all(s);  // its rows are undefined until written
    EXPECT_TRUE(rows_match(s));
    append(s, 2);
    EXPECT_TRUE(positions_are(
        s, {{{0, 5, 9, 12, 13}, {12, 13}, {2, 12, 13}}, {{1, 2, 3, 12, 13}, {4, 12, 13}, {0, 8, 11, 12, 13}}}));
    EXPECT_TRUE(rows_match(s));

    KvStore e = KvStore::restore(hp_, be(), every(2, 3, {}), 0, 4);
    EXPECT_EQ(e.next_pos(), 0);
    EXPECT_EQ(e.total_rows(), 0);
    EXPECT_TRUE(capacities_are(e, {{4, 4, 4}, {4, 4, 4}}));
}

TEST_F(KvStoreTest, RestoreFromSavedRowsGivesTheSameStore) {
    // what a cache file does: the positions, next_pos and F16 rows of a compacted store, restored
    KvStore src(hp_, be(), 12);
    append(src, 12);
    src.compact({{{0, 3, 4, 11}, {}, {5}}, {{1, 2}, range(0, 12), {6, 7, 8}}}, 5);
    const std::vector<std::vector<ggml_fp16_t>> saved = raw_rows(src);

    KvStore r = KvStore::restore(hp_, be(), positions_of(src), src.next_pos(), 0);
    size_t i = 0;
    for (int il = 0; il < 2; ++il)
        for (int h = 0; h < 3; ++h)
            for (bool value : {false, true}) r.write_rows(il, h, value, saved[i++].data());
    EXPECT_TRUE(positions_are(r, positions_of(src)));
    EXPECT_EQ(r.next_pos(), 12);
    EXPECT_TRUE(rows_plus_reserve(r, 0));
    EXPECT_TRUE(raw_rows(r) == saved);
    EXPECT_TRUE(rows_match(r));
    EXPECT_TRUE(layout_ok(r, be()));
}

TEST_F(KvStoreTest, RestoreRefusesShapesAndPositionsThatDoNotFit) {
    const Positions ok = {{{0, 1}, {2}, {}}, {{0}, {1}, {2}}};
    EXPECT_NO_THROW(KvStore::restore(hp_, be(), ok, 3, 0));
    auto edited = [&](int il, int h, std::vector<int32_t> pos) {
        Positions p = ok;
        p[size_t(il)][size_t(h)] = std::move(pos);
        return p;
    };
    EXPECT_THROW(KvStore::restore(hp_, be(), every(1, 3, {}), 3, 0), Error);  // 1 layer of 2
    EXPECT_THROW(KvStore::restore(hp_, be(), every(3, 3, {}), 3, 0), Error);  // 3 layers of 2
    Positions two_heads = ok;
    two_heads[1].pop_back();
    EXPECT_THROW(KvStore::restore(hp_, be(), two_heads, 3, 0), Error);
    EXPECT_THROW(KvStore::restore(hp_, be(), edited(0, 0, {0, 3}), 3, 0), Error);  // not below next_pos
    EXPECT_THROW(KvStore::restore(hp_, be(), edited(0, 0, {1, 0}), 3, 0), Error);  // not ascending
    EXPECT_THROW(KvStore::restore(hp_, be(), edited(1, 1, {1, 1}), 3, 0), Error);  // repeated
    EXPECT_THROW(KvStore::restore(hp_, be(), edited(1, 2, {-1}), 3, 0), Error);
    EXPECT_THROW(KvStore::restore(hp_, be(), ok, 3, -1), Error);  // negative reserve
}

TEST_F(KvStoreTest, CopyIsDeepAndIndependent) {
    KvStore s(hp_, be(), 12);
    append(s, 10);
    s.compact({{{0, 4, 9}, {}, range(0, 10)}, {{2, 3}, {5}, {1, 8}}}, 1);
    append(s, 1);  // position 10 everywhere
    const Positions pos = positions_of(s);
    const std::vector<std::vector<ggml_fp16_t>> raw = raw_rows(s);

    KvStore c = s.copy();
    EXPECT_TRUE(positions_are(c, pos));
    EXPECT_EQ(c.next_pos(), 11);
    EXPECT_TRUE(raw_rows(c) == raw);
    EXPECT_TRUE(rows_match(c));
    EXPECT_TRUE(layout_ok(c, be()));

    // new bytes, new rows and a compaction in the copy: the original's bytes and positions stay
    write_all(c, 7);
    EXPECT_TRUE(rows_match(c, 7));
    c.reserve(3);
    append(c, 3, 7);
    c.compact(KeepPlan(2, std::vector<std::vector<int32_t>>(3, std::vector<int32_t>{0})), 0);  // row 0 of each
    c.truncate(5, 0);
    EXPECT_TRUE(rows_match(c, 7));
    EXPECT_TRUE(raw_rows(s) == raw);
    EXPECT_TRUE(positions_are(s, pos));
    EXPECT_EQ(s.next_pos(), 11);
    EXPECT_TRUE(rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));

    // and the other way round
    KvStore d = s.copy();
    write_all(s, 9);
    s.compact(KeepPlan(2, std::vector<std::vector<int32_t>>(3)), 0);
    EXPECT_TRUE(raw_rows(d) == raw);
    EXPECT_TRUE(positions_are(d, pos));
    EXPECT_EQ(d.next_pos(), 11);
    EXPECT_TRUE(rows_match(d));
}

TEST_F(KvStoreTest, CopyHasTheRoomAskedAndReserveKeepsIt) {
    KvStore s(hp_, be(), 6);
    append(s, 6);
    s.compact({{{0, 5}, {1, 2, 3}, range(0, 6)}, {{4}, range(0, 6), {2, 3}}}, 0);  // no room left
    for (int64_t room : {0, 5}) {
        KvStore c = s.copy(room);
        for (int il = 0; il < 2; ++il)
            for (int h = 0; h < 3; ++h) EXPECT_GE(c.capacity(il, h) - c.n_rows(il, h), room) << "room " << room;
        const Caps caps = {{c.capacity(0, 0), c.capacity(0, 1), c.capacity(0, 2)},
                           {c.capacity(1, 0), c.capacity(1, 1), c.capacity(1, 2)}};
        const uint64_t bytes = c.bytes();
        c.reserve(room);  // answering from the copy never regrows it
        EXPECT_TRUE(capacities_are(c, caps)) << "room " << room;
        EXPECT_EQ(c.bytes(), bytes) << "room " << room;
        append(c, room);
        EXPECT_EQ(c.next_pos(), 6 + room);
        EXPECT_TRUE(rows_match(c)) << "room " << room;
        EXPECT_TRUE(layout_ok(c, be())) << "room " << room;
    }
}

TEST_F(KvStoreTest, BytesFollowCapacitiesAndHeldRows) {
    KvStore s(hp_, be(), 100);
    const uint64_t row = s.row_bytes();
    EXPECT_EQ(row, 2u * 8u * 2u);  // K and V, 8 halves each
    EXPECT_GE(s.bytes(), 2u * 3u * 100u * row);
    EXPECT_TRUE(layout_ok(s, be()));
    append(s, 10);
    EXPECT_EQ(s.used_bytes(), 2u * 3u * 10u * row);
    const uint64_t big = s.bytes();

    s.compact({{{1}, {}, {2, 3}}, {{0}, {0}, {9}}}, 0);  // 6 rows kept: the memory of the others is freed
    EXPECT_EQ(s.used_bytes(), 6u * row);
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_LT(s.bytes(), big / 10);
    s.fit(4);
    EXPECT_EQ(s.used_bytes(), 6u * row);
    EXPECT_TRUE(rows_plus_reserve(s, 4));
    EXPECT_TRUE(layout_ok(s, be()));
    KvStore c = s.copy(10);
    EXPECT_EQ(c.used_bytes(), s.used_bytes());
    EXPECT_TRUE(layout_ok(c, be()));
}

// --- quantized rows ----------------------------------------------------------------------

// The stored bytes of the K (value false) or V row at position pos of segment (il, h): the
// row's elements quantized by ggml's reference quantizer (or rounded to F16).
std::vector<uint8_t> quant_row(ggml_type t, int il, int h, int32_t pos, int d, bool value, uint64_t salt) {
    std::vector<float> x(static_cast<size_t>(d));
    for (int e = 0; e < d; ++e) x[size_t(e)] = element(il, h, pos, e, value, salt);
    std::vector<uint8_t> out(ggml_row_size(t, d));
    if (t == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(x.data(), reinterpret_cast<ggml_fp16_t *>(out.data()), d);
    else
        ggml_quantize_chunk(t, x.data(), out.data(), 0, 1, d, nullptr);
    return out;
}

// Writes every held row as quant_row() gives it.
void write_all_quant(KvStore & s, uint64_t salt = 0) {
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            for (bool value : {false, true}) {
                const ggml_type t = value ? s.types().v : s.types().k;
                std::vector<uint8_t> rows;
                for (int32_t p : s.positions(il, h)) {
                    const auto r = quant_row(t, il, h, p, s.head_dim(), value, salt);
                    rows.insert(rows.end(), r.begin(), r.end());
                }
                s.write_rows(il, h, value, rows.data());
            }
}

// Every held row holds quant_row()'s bytes for its (layer, head, position), and read_k / read_v
// give what ggml's dequantizer makes of them, rotated back where the store rotates.
::testing::AssertionResult quant_rows_match(const KvStore & s, uint64_t salt = 0) {
    const int d = s.head_dim();
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h)
            for (bool value : {false, true}) {
                const ggml_type t = value ? s.types().v : s.types().k;
                const size_t rb = ggml_row_size(t, d);
                if (rb != (value ? s.v_row_bytes() : s.k_row_bytes()))
                    return ::testing::AssertionFailure() << "row bytes of " << ggml_type_name(t);
                const std::vector<int32_t> & pos = s.positions(il, h);
                std::vector<uint8_t> raw(pos.size() * rb);
                s.read_rows(il, h, value, raw.data());
                std::vector<float> want(raw.size() / rb * size_t(d));
                for (size_t r = 0; r < pos.size(); ++r) {
                    if (quant_row(t, il, h, pos[r], d, value, salt) !=
                        std::vector<uint8_t>(raw.begin() + long(r * rb), raw.begin() + long((r + 1) * rb)))
                        return ::testing::AssertionFailure()
                               << "layer " << il << " head " << h << " row " << r << " (position " << pos[r] << ") of "
                               << (value ? "V" : "K") << ": other bytes";
                }
                if (!raw.empty()) ggml_get_type_traits(t)->to_float(raw.data(), want.data(), int64_t(want.size()));
                const int32_t rot = value ? s.types().v_rotation(d) : s.types().k_rotation(d);
                if (rot > 0) hadamard_rows(want.data(), int64_t(want.size()), rot);
                if ((value ? s.read_v(il, h) : s.read_k(il, h)) != want)
                    return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": read_"
                                                         << (value ? "v" : "k") << " is not ggml's dequantization";
            }
    return ::testing::AssertionSuccess();
}

// Q8_0 K and Q4_0 V (and the reverse) through every operation: each row keeps its bytes and its
// position, the tensors have the types, bytes() and used_bytes() follow the types' row sizes.
TEST_F(KvStoreTest, QuantizedRowsKeepTheirBytesThroughEveryOperation) {
    const HParams hp = shape(2, 3, 64);
    for (const CacheTypes types :
         {CacheTypes{GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}, CacheTypes{GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}}) {
        SCOPED_TRACE(std::string("K ") + ggml_type_name(types.k) + ", V " + ggml_type_name(types.v));
        KvStore s(hp, be(), 10, types);
        EXPECT_EQ(s.types(), types);
        EXPECT_EQ(s.k_row_bytes(), ggml_row_size(types.k, 64));
        EXPECT_EQ(s.row_bytes(), ggml_row_size(types.k, 64) + ggml_row_size(types.v, 64));
        s.commit(10);
        write_all_quant(s);
        EXPECT_TRUE(quant_rows_match(s));
        EXPECT_TRUE(layout_ok(s, be()));
        s.reserve(20);  // grows: rows copied into the bigger store
        EXPECT_TRUE(quant_rows_match(s));
        EXPECT_TRUE(layout_ok(s, be()));
        KvStore c = s.copy(3);
        EXPECT_EQ(c.types(), types);
        EXPECT_TRUE(quant_rows_match(c));
        KeepPlan keep(2);
        for (int il = 0; il < 2; ++il) keep[size_t(il)] = {{0, 3, 9}, {}, {1, 2, 3, 4, 5, 6, 7, 8}};
        s.compact(keep, 2);
        EXPECT_TRUE(positions_are(s, {{{0, 3, 9}, {}, range(1, 9)}, {{0, 3, 9}, {}, range(1, 9)}}));
        EXPECT_TRUE(quant_rows_match(s));
        EXPECT_TRUE(layout_ok(s, be()));
        EXPECT_TRUE(rows_plus_reserve(s, 2));
        s.truncate(4, 1);
        EXPECT_TRUE(positions_are(s, {{{0, 3}, {}, range(1, 4)}, {{0, 3}, {}, range(1, 4)}}));
        EXPECT_TRUE(quant_rows_match(s));
        EXPECT_TRUE(layout_ok(s, be()));
        KvStore r = KvStore::restore(hp, be(), positions_of(c), c.next_pos(), 0, types);
        for (int il = 0; il < 2; ++il)
            for (int h = 0; h < 3; ++h)
                for (bool value : {false, true}) {
                    std::vector<uint8_t> raw(size_t(c.n_rows(il, h)) * (value ? c.v_row_bytes() : c.k_row_bytes()));
                    c.read_rows(il, h, value, raw.data());
                    r.write_rows(il, h, value, raw.data());
                }
        EXPECT_TRUE(quant_rows_match(r));
        EXPECT_TRUE(layout_ok(r, be()));
        EXPECT_TRUE(quant_rows_match(c));  // the copy never saw the compactions
    }
}

TEST_F(KvStoreTest, QuantizedSlidingSegmentsSlideWholeUnits) {
    HParams hp = shape(2, 2, 32);
    hp.n_swa = k_window;
    hp.swa_layers = {1, 0};
    const CacheTypes types{GGML_TYPE_Q4_0, GGML_TYPE_Q4_0};
    KvStore s(hp, be(), KvStore::k_slide_rows + 200, types);
    s.commit(KvStore::k_slide_rows + 150);
    write_all_quant(s);
    s.slide();
    EXPECT_EQ(s.positions(0, 0), range(int32_t(KvStore::k_slide_rows), int32_t(KvStore::k_slide_rows + 150)));
    EXPECT_EQ(s.n_rows(1, 0), KvStore::k_slide_rows + 150);
    EXPECT_TRUE(quant_rows_match(s));
    EXPECT_TRUE(layout_ok(s, be()));
}

// --- mixed precision ----------------------------------------------------------------------

// What a row of the elements of (layer, head, position) reads back as after compact_mixed put it
// in a run of type t, the store rotating by rot: rotated, stored as t by ggml's reference
// quantizer (F16: rounded), dequantized, rotated back.
std::vector<float> mixed_row(ggml_type t, int32_t rot, int il, int h, int32_t pos, int d, bool value) {
    std::vector<float> x(static_cast<size_t>(d));
    for (int e = 0; e < d; ++e) x[size_t(e)] = element(il, h, pos, e, value, 0);
    if (rot > 0) hadamard_rows(x.data(), d, rot);
    std::vector<uint8_t> raw(ggml_row_size(t, d));
    ggml_quantize_chunk(t, x.data(), raw.data(), 0, 1, d, nullptr);
    ggml_get_type_traits(t)->to_float(raw.data(), x.data(), d);
    if (rot > 0) hadamard_rows(x.data(), d, rot);
    return x;
}

// Both runs of every segment: positions as given, values as mixed_row() gives them, the byte
// accounting of the two types, and no position held twice.
::testing::AssertionResult mixed_ok(const KvStore & s, const Positions & high, const Positions & low) {
    const int d = s.head_dim();
    int64_t held = 0, held_low = 0;
    for (int il = 0; il < s.n_layer(); ++il)
        for (int h = 0; h < s.n_head_kv(); ++h) {
            const auto & hp = s.positions(il, h);
            const auto & lp = s.low_positions(il, h);
            if (hp != high[size_t(il)][size_t(h)] || lp != low[size_t(il)][size_t(h)])
                return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": other positions";
            if (s.rows_per_segment()[size_t(il)][size_t(h)] != int64_t(hp.size() + lp.size()))
                return ::testing::AssertionFailure() << "rows_per_segment of layer " << il << " head " << h;
            held += int64_t(hp.size());
            held_low += int64_t(lp.size());
            for (bool value : {false, true}) {
                const int32_t rot = value ? s.types().v_rotation(d) : s.types().k_rotation(d);
                const ggml_type t = value ? s.types().v : s.types().k;
                std::vector<float> want, want_low;
                for (int32_t p : hp) {
                    const auto r = mixed_row(t, rot, il, h, p, d, value);
                    want.insert(want.end(), r.begin(), r.end());
                }
                for (int32_t p : lp) {
                    const auto r = mixed_row(s.types().low, rot, il, h, p, d, value);
                    want_low.insert(want_low.end(), r.begin(), r.end());
                }
                if ((value ? s.read_v(il, h) : s.read_k(il, h)) != want)
                    return ::testing::AssertionFailure() << "layer " << il << " head " << h << ": other "
                                                         << (value ? "V" : "K") << " values at the cache type";
                if (s.read_low(il, h, value) != want_low)
                    return ::testing::AssertionFailure()
                           << "layer " << il << " head " << h << ": other demoted " << (value ? "V" : "K") << " values";
            }
        }
    if (s.total_rows() != held + held_low || s.total_low_rows() != held_low)
        return ::testing::AssertionFailure() << "total_rows " << s.total_rows() << ", total_low_rows "
                                             << s.total_low_rows() << "; held " << held << " + " << held_low;
    const uint64_t used = uint64_t(held) * s.row_bytes() + uint64_t(held_low) * 2 * ggml_row_size(s.types().low, d);
    if (s.used_bytes() != used)
        return ::testing::AssertionFailure() << "used_bytes " << s.used_bytes() << ", want " << used;
    if (s.bytes() < used) return ::testing::AssertionFailure() << "bytes below used_bytes";
    return ::testing::AssertionSuccess();
}

// compact_mixed: the rows `high` stay at F16, the rows `low` go to Q8_0 / Q4_0 (rotated when the
// store rotates: its F16 rows too), the others are freed; copy, reserve, commit, compact, truncate,
// fit and restore keep both runs.
TEST_F(KvStoreTest, MixedRowsKeepTheirValuesThroughEveryOperation) {
    const HParams hp = shape(2, 3, 64);
    for (const ggml_type low : {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0})
        for (const bool rotate : {true, false}) {
            SCOPED_TRACE(std::string("demoted to ") + ggml_type_name(low) + (rotate ? ", rotated" : ""));
            KvStore s(hp, be(), 12, CacheTypes{GGML_TYPE_F16, GGML_TYPE_F16, rotate});
            s.commit(12);
            write_all(s);
            KeepPlan high(2), demote(2);
            for (int il = 0; il < 2; ++il) {
                high[size_t(il)] = {{0, 5, 11}, {}, range(1, 8)};
                demote[size_t(il)] = {{1, 2, 3}, range(0, 6), {8, 9}};
            }
            s.compact_mixed(high, demote, low, 2);
            EXPECT_EQ(s.types().low, low);
            EXPECT_EQ(s.types().k_rotation(64), rotate ? 64 : 0);
            Positions hi_pos = every(2, 3, {}), lo_pos = every(2, 3, {});
            for (int il = 0; il < 2; ++il) {
                hi_pos[size_t(il)] = {{0, 5, 11}, {}, range(1, 8)};
                lo_pos[size_t(il)] = {{1, 2, 3}, range(0, 6), {8, 9}};
            }
            EXPECT_TRUE(mixed_ok(s, hi_pos, lo_pos));
            EXPECT_FALSE(s.layer_uniform(0));
            EXPECT_FALSE(s.uniform());
            KvStore c = s.copy(4);
            EXPECT_TRUE(mixed_ok(c, hi_pos, lo_pos));
            s.reserve(20);  // grows
            EXPECT_TRUE(mixed_ok(s, hi_pos, lo_pos));
            s.commit(1);  // a new row is appended to the first run only
            EXPECT_EQ(s.positions(0, 1), std::vector<int32_t>{12});
            s.rollback(1);
            KeepPlan keep(2);
            for (int il = 0; il < 2; ++il) keep[size_t(il)] = {{0, 2}, {}, {0, 6}};
            s.compact(keep, 1);  // the first run only; the demoted rows stay
            for (int il = 0; il < 2; ++il) hi_pos[size_t(il)] = {{0, 11}, {}, {1, 7}};
            EXPECT_TRUE(mixed_ok(s, hi_pos, lo_pos));
            s.truncate(5, 1);  // both runs lose the positions from 5 on
            for (int il = 0; il < 2; ++il) {
                hi_pos[size_t(il)] = {{0}, {}, {1}};
                lo_pos[size_t(il)] = {{1, 2, 3}, range(0, 5), {}};
            }
            EXPECT_TRUE(mixed_ok(s, hi_pos, lo_pos));
            s.fit(0);
            EXPECT_TRUE(mixed_ok(s, hi_pos, lo_pos));
            // restored from the stored bytes of both runs
            KvStore r = KvStore::restore(hp, be(), positions_of(s), s.next_pos(), 1, s.types(), lo_pos);
            for (int il = 0; il < 2; ++il)
                for (int h = 0; h < 3; ++h)
                    for (bool value : {false, true})
                        for (bool in_low : {false, true}) {
                            std::vector<uint8_t> raw(size_t(in_low ? s.n_low(il, h) * int64_t(s.low_row_bytes())
                                                                   : s.n_rows(il, h) * int64_t(s.k_row_bytes())));
                            s.read_rows(il, h, value, raw.data(), in_low);
                            r.write_rows(il, h, value, raw.data(), in_low);
                        }
            EXPECT_TRUE(mixed_ok(r, hi_pos, lo_pos));
            EXPECT_THROW(s.compact_mixed(keep, keep, low == GGML_TYPE_Q8_0 ? GGML_TYPE_Q4_0 : GGML_TYPE_Q8_0, 0),
                         Error);  // one demoted type per store
        }
}

TEST_F(KvStoreTest, MixedCompactionRefusesOverlappingPlansAndKeepsTheStore) {
    const HParams hp = shape(2, 3, 64);
    KvStore s(hp, be(), 6);
    s.commit(6);
    write_all(s);
    KeepPlan high(2, {{0, 1}, {2}, {}}), demote(2, {{1, 2}, {3}, {}});
    EXPECT_THROW(s.compact_mixed(high, demote, GGML_TYPE_Q4_0, 0), Error);  // row 1 of head 0 in both
    demote = KeepPlan(2, {{2, 7}, {3}, {}});
    EXPECT_THROW(s.compact_mixed(high, demote, GGML_TYPE_Q4_0, 0), Error);                      // row 7 out of range
    EXPECT_THROW(s.compact_mixed(high, KeepPlan(2, {{2}, {3}, {}}), GGML_TYPE_F16, 0), Error);  // not a lower type
    EXPECT_FALSE(s.types().mixed());
    EXPECT_TRUE(layout_ok(s, be()));
    EXPECT_EQ(s.total_rows(), 2 * 3 * 6);
}

// The Walsh-Hadamard rotation against the matrix written out in double: H_n[i][j] =
// (-1)^popcount(i & j) / sqrt(n); H H = I; and the sizes llama.cpp picks.
TEST(Hadamard, MatchesTheMatrixAndIsItsOwnInverse) {
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd;
    for (int32_t n : {64, 128, 256}) {
        std::vector<float> x(size_t(3 * n));
        for (float & v : x) v = nd(rng);
        std::vector<float> y = x;
        hadamard_rows(y.data(), int64_t(y.size()), n);
        for (int piece = 0; piece < 3; ++piece)
            for (int32_t j = 0; j < n; ++j) {
                double want = 0;
                for (int32_t i = 0; i < n; ++i)
                    want += double(x[size_t(piece * n + i)]) * (__builtin_popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0);
                want /= std::sqrt(double(n));
                EXPECT_NEAR(y[size_t(piece * n + j)], want, 1e-5) << "n " << n;
            }
        hadamard_rows(y.data(), int64_t(y.size()), n);
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
    }
    const CacheTypes q{GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    EXPECT_EQ(q.k_rotation(64), 64);
    EXPECT_EQ(q.k_rotation(128), 128);
    EXPECT_EQ(q.k_rotation(192), 64);
    EXPECT_EQ(q.k_rotation(256), 256);
    EXPECT_EQ(q.v_rotation(256), 64);
    EXPECT_EQ(q.k_rotation(96), 0);  // not a multiple of 64
    EXPECT_EQ(CacheTypes{}.k_rotation(128), 0);
    EXPECT_EQ((CacheTypes{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, false}.k_rotation(128)), 0);
    EXPECT_EQ((CacheTypes{GGML_TYPE_F16, GGML_TYPE_Q8_0}.k_rotation(128)), 0);
}

TEST_F(KvStoreTest, QuantizedTypesNeedWholeBlocks) {
    EXPECT_THROW(KvStore(shape(1, 1, 16), be(), 4, {GGML_TYPE_Q8_0, GGML_TYPE_F16}), Error);
    EXPECT_THROW(KvStore(shape(1, 1, 48), be(), 4, {GGML_TYPE_F16, GGML_TYPE_Q4_0}), Error);
    EXPECT_THROW(KvStore(shape(1, 1, 64), be(), 4, {GGML_TYPE_Q4_1, GGML_TYPE_F16}), Error);
    EXPECT_NO_THROW(KvStore(shape(1, 1, 96), be(), 4, {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}));
    EXPECT_EQ(parse_cache_type("q8_0"), GGML_TYPE_Q8_0);
    EXPECT_EQ(parse_cache_type("f16"), GGML_TYPE_F16);
    EXPECT_THROW(parse_cache_type("q4_1"), Error);
    EXPECT_THROW(parse_cache_type("Q8_0"), Error);
}

}  // namespace
}  // namespace kvlab
