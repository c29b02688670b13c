// kvlab's float32 attention kernel against a plain double-precision reference on random
// tensors, for segments of different lengths per KV head, any thread count and split, over
// F16 rows and over ggml's Q8_0 / Q4_0 rows (quantized by ggml's reference quantizers; the
// reference reads the values ggml's dequantizers give).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernels/attention.h"

namespace kvlab {
namespace {

struct Case {
    int n_q, n_head, n_head_kv, head_dim;
    std::vector<int64_t> rows;  // rows per KV head (the query rows' own rows included)
};

struct Types {
    ggml_type k = GGML_TYPE_F16, v = GGML_TYPE_F16;
};

struct Data {
    Types types;
    // mixed precision: per KV head a demoted run of type low (empty: none), positions among the
    // old rows' (all seen by every query)
    ggml_type low = GGML_TYPE_COUNT;
    std::vector<std::vector<uint8_t>> lk, lv;
    std::vector<std::vector<float>> lkf, lvf;
    std::vector<std::vector<int32_t>> lpos;
    std::vector<float> q;                    // [n_q][n_head][head_dim]
    std::vector<std::vector<uint8_t>> k, v;  // per KV head [rows] of its type
    std::vector<std::vector<float>> kf, vf;  // the same rows as ggml's dequantizer reads them
    std::vector<std::vector<int32_t>> pos;   // per KV head, ascending
    std::vector<int32_t> q_pos;
};

// n rows of head_dim values stored as type t (ggml's reference quantizers) and read back.
void store(ggml_type t, const std::vector<float> & x, int64_t n, int d, std::vector<uint8_t> & raw,
           std::vector<float> & back) {
    raw.resize(size_t(n) * ggml_row_size(t, d));
    if (t == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(x.data(), reinterpret_cast<ggml_fp16_t *>(raw.data()), int64_t(x.size()));
    else
        ggml_quantize_chunk(t, x.data(), raw.data(), 0, n, d, nullptr);
    back.resize(x.size());
    ggml_get_type_traits(t)->to_float(raw.data(), back.data(), int64_t(x.size()));
}

Data make_data(const Case & c, uint64_t seed, Types types = {}) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    Data d;
    d.types = types;
    d.q.resize(size_t(c.n_q) * c.n_head * c.head_dim);
    for (float & x : d.q) x = 2.0f * nd(rng);
    const int32_t last = 5000;
    for (int i = 0; i < c.n_q; ++i) d.q_pos.push_back(last - c.n_q + 1 + i);
    for (int h = 0; h < c.n_head_kv; ++h) {
        const int64_t n = c.rows[h];
        std::vector<float> kx(size_t(n) * c.head_dim), vx(kx.size());
        for (auto & x : kx) x = nd(rng);
        for (auto & x : vx) x = nd(rng);
        std::vector<uint8_t> k, v;
        std::vector<float> kf, vf;
        store(types.k, kx, n, c.head_dim, k, kf);
        store(types.v, vx, n, c.head_dim, v, vf);
        // old rows at sparse increasing positions (a compressed cache), then the query rows
        std::vector<int32_t> p;
        const int64_t old = n - c.n_q;
        for (int64_t j = 0; j < old; ++j) p.push_back(int32_t(j * (last - c.n_q) / std::max<int64_t>(1, old)));
        for (int i = 0; i < c.n_q; ++i) p.push_back(d.q_pos[i]);
        d.k.push_back(std::move(k));
        d.v.push_back(std::move(v));
        d.kf.push_back(std::move(kf));
        d.vf.push_back(std::move(vf));
        d.pos.push_back(std::move(p));
    }
    return d;
}

// Adds to d a demoted run of low[h] rows of type t per KV head, at positions no other row of
// the head holds, below the queries'.
void add_low_runs(Data & d, const Case & c, ggml_type t, const std::vector<int64_t> & low, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    d.low = t;
    for (int h = 0; h < c.n_head_kv; ++h) {
        std::vector<int32_t> p;
        for (int32_t x = 0; x < d.q_pos[0] && int64_t(p.size()) < low[h]; ++x)
            if (!std::binary_search(d.pos[h].begin(), d.pos[h].end(), x) && rng() % 3 != 0) p.push_back(x);
        std::vector<float> kx(p.size() * size_t(c.head_dim)), vx(kx.size());
        for (auto & x : kx) x = nd(rng);
        for (auto & x : vx) x = nd(rng);
        std::vector<uint8_t> k, v;
        std::vector<float> kf, vf;
        store(t, kx, int64_t(p.size()), c.head_dim, k, kf);
        store(t, vx, int64_t(p.size()), c.head_dim, v, vf);
        d.lk.push_back(std::move(k));
        d.lv.push_back(std::move(v));
        d.lkf.push_back(std::move(kf));
        d.lvf.push_back(std::move(vf));
        d.lpos.push_back(std::move(p));
    }
}

std::vector<double> reference(const Case & c, const Data & d, float scale) {
    std::vector<double> out(size_t(c.n_q) * c.n_head * c.head_dim, 0.0);
    const int group = c.n_head / c.n_head_kv;
    for (int i = 0; i < c.n_q; ++i)
        for (int qh = 0; qh < c.n_head; ++qh) {
            const int h = qh / group;
            const float * q = d.q.data() + (size_t(i) * c.n_head + qh) * c.head_dim;
            std::vector<double> s;
            std::vector<const float *> vs;  // the value row of each score
            auto add = [&](const float * k, const float * v) {
                double dot = 0;
                for (int e = 0; e < c.head_dim; ++e) dot += double(q[e]) * k[e];
                s.push_back(dot * scale);
                vs.push_back(v);
            };
            for (int64_t j = 0; j < c.rows[h]; ++j) {
                if (d.pos[h][j] > d.q_pos[i]) break;
                add(&d.kf[h][j * c.head_dim], &d.vf[h][j * c.head_dim]);
            }
            for (size_t j = 0; h < int(d.lpos.size()) && j < d.lpos[h].size(); ++j)
                add(&d.lkf[h][j * c.head_dim], &d.lvf[h][j * c.head_dim]);
            double m = -1e300, z = 0;
            for (double x : s) m = std::max(m, x);
            for (double & x : s) z += (x = std::exp(x - m));
            double * o = out.data() + (size_t(i) * c.n_head + qh) * c.head_dim;
            for (size_t j = 0; j < s.size(); ++j)
                for (int e = 0; e < c.head_dim; ++e) o[e] += s[j] / z * vs[j][e];
        }
    return out;
}

// ahead: K and V converted to float32 by kernels::attn::convert first (as a prefill graph does)
std::vector<float> run_kernel(const Case & c, const Data & d, float scale, int64_t chunk_rows, int nth,
                              bool ahead = false) {
    kernels::attn::Problem p;
    p.n_q = c.n_q;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.scale = scale;
    p.q_pos = d.q_pos.data();
    p.chunk_rows = chunk_rows;
    for (int h = 0; h < c.n_head_kv; ++h)
        p.seg.push_back({d.k[h].data(), d.v[h].data(), d.types.k, d.types.v, d.pos[h].data(), c.rows[h]});
    for (size_t h = 0; h < d.lpos.size(); ++h)
        p.low.push_back({d.lk[h].data(), d.lv[h].data(), d.low, d.low, d.lpos[h].data(), int64_t(d.lpos[h].size())});
    std::vector<float> out(size_t(c.n_q) * c.n_head * c.head_dim);
    std::vector<float> part(size_t(p.n_chunks()) * c.n_q * c.n_head * (c.head_dim + 2));
    std::vector<float> pre;
    if (ahead) {
        EXPECT_TRUE(kernels::attn::converts_ahead(p));
        pre.resize(size_t(kernels::attn::converted_floats(p)));
        for (int t = 0; t < nth; ++t) kernels::attn::convert(p, pre.data(), t, nth);
    }
    // the threads' scratch holds bytes of all ones first: what it held must not change a bit
    kernels::ScratchBuffer scratch(kernels::attn::compute_scratch(p).bytes(), nth, 0xff);
    for (int t = 0; t < nth; ++t)
        kernels::attn::compute(p, d.q.data(), c.head_dim, int64_t(c.n_head) * c.head_dim, part.data(), t, nth,
                               ahead ? pre.data() : nullptr, scratch.slice(t));
    for (int t = 0; t < nth; ++t) kernels::attn::merge(p, part.data(), out.data(), t, nth);
    return out;
}

TEST(Attention, MatchesPlainReferenceOnAnyShape) {
    const std::vector<Case> cases = {
        {1, 9, 3, 64, {700, 700, 700}},      // decode, uniform heads
        {1, 9, 3, 64, {40, 1300, 3}},        // decode, heads of different lengths
        {7, 8, 2, 64, {300, 57}},            // a short query, GQA 4
        {70, 4, 4, 32, {200, 71, 150, 90}},  // a long query, no GQA
        {3, 14, 2, 72, {129, 64}},           // head_dim not a multiple of 16
    };
    uint64_t seed = 1;
    for (const Case & c : cases) {
        const Data d = make_data(c, seed++);
        SCOPED_TRACE("case with head_dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.n_q) + " queries");
        const float scale = 1.0f / std::sqrt(float(c.head_dim));
        const auto ref = reference(c, d, scale);
        const auto first = run_kernel(c, d, scale, 512, 1);
        for (int64_t chunk_rows : {512, 100, 64})
            for (int nth : {1, 2, 5}) {
                const auto got = run_kernel(c, d, scale, chunk_rows, nth);
                double max_err = 0;
                for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - ref[i]));
                EXPECT_LT(max_err, 2e-5) << "n_q " << c.n_q << " chunk rows " << chunk_rows << " threads " << nth;
                // the thread count never changes the arithmetic
                if (chunk_rows == 512) {
                    EXPECT_EQ(got, first) << "threads " << nth;
                }
            }
    }
}

// Quantized rows: the kernel reads exactly ggml's dequantized values (its 16-wide
// conversion and ggml's scalar dequantizer agree to the bit: the same exact products), so the
// bound against the double reference is the F16 one; converting ahead and the thread count
// change no bit; K and V of different types.
TEST(Attention, QuantizedRowsMatchTheReference) {
    const std::vector<Case> cases = {
        {1, 9, 3, 64, {700, 40, 700}},       // decode, heads of different lengths
        {70, 4, 4, 32, {200, 71, 150, 90}},  // a long query, no GQA (converted ahead)
        {17, 14, 2, 128, {129, 64}},         // GQA 7, head_dim 128
    };
    const std::vector<Types> types = {{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
                                      {GGML_TYPE_Q4_0, GGML_TYPE_Q4_0},
                                      {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0},
                                      {GGML_TYPE_F16, GGML_TYPE_Q8_0},
                                      {GGML_TYPE_Q4_0, GGML_TYPE_F16}};
    uint64_t seed = 40;
    for (const Types & t : types)
        for (const Case & c : cases) {
            SCOPED_TRACE(std::string("K ") + ggml_type_name(t.k) + ", V " + ggml_type_name(t.v) + ", head_dim " +
                         std::to_string(c.head_dim) + ", " + std::to_string(c.n_q) + " queries");
            const Data d = make_data(c, seed++, t);
            const float scale = 1.0f / std::sqrt(float(c.head_dim));
            const auto ref = reference(c, d, scale);
            const auto first = run_kernel(c, d, scale, 512, 1);
            for (int64_t chunk_rows : {512, 64})
                for (int nth : {1, 3}) {
                    const auto got = run_kernel(c, d, scale, chunk_rows, nth);
                    double max_err = 0;
                    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - ref[i]));
                    EXPECT_LT(max_err, 2e-5) << "chunk rows " << chunk_rows << " threads " << nth;
                    if (chunk_rows == 512) {
                        EXPECT_EQ(got, first) << "threads " << nth;
                    }
                    if (kernels::attn::converts_ahead({.n_q = c.n_q, .chunk_rows = chunk_rows})) {
                        EXPECT_EQ(run_kernel(c, d, scale, chunk_rows, nth, true), got) << "converted ahead";
                    }
                }
        }
}

// Mixed precision: each KV head also holds a demoted run of Q8_0 or Q4_0 rows (its own
// positions, interleaved with the others'), attended as chunks of their own before the head's rows.
TEST(Attention, MixedRunsMatchTheReference) {
    const std::vector<std::pair<Case, std::vector<int64_t>>> cases = {
        {{1, 9, 3, 64, {300, 40, 700}}, {500, 0, 70}},          // decode; a head without demoted rows
        {{70, 4, 4, 32, {200, 71, 150, 90}}, {90, 600, 3, 1}},  // a long query (converted ahead)
        {{17, 14, 2, 128, {129, 64}}, {64, 1100}},              // GQA 7, head_dim 128
    };
    const std::vector<std::pair<Types, ggml_type>> types = {{{GGML_TYPE_F16, GGML_TYPE_F16}, GGML_TYPE_Q4_0},
                                                            {{GGML_TYPE_F16, GGML_TYPE_F16}, GGML_TYPE_Q8_0},
                                                            {{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0}, GGML_TYPE_Q4_0}};
    uint64_t seed = 70;
    for (const auto & [t, low] : types)
        for (const auto & [c, lows] : cases) {
            SCOPED_TRACE(std::string("K ") + ggml_type_name(t.k) + ", V " + ggml_type_name(t.v) + ", demoted " +
                         ggml_type_name(low) + ", head_dim " + std::to_string(c.head_dim) + ", " +
                         std::to_string(c.n_q) + " queries");
            Data d = make_data(c, seed++, t);
            add_low_runs(d, c, low, lows, seed++);
            const float scale = 1.0f / std::sqrt(float(c.head_dim));
            const auto ref = reference(c, d, scale);
            const auto first = run_kernel(c, d, scale, 512, 1);
            for (int64_t chunk_rows : {512, 64})
                for (int nth : {1, 3}) {
                    const auto got = run_kernel(c, d, scale, chunk_rows, nth);
                    double max_err = 0;
                    for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(got[i] - ref[i]));
                    EXPECT_LT(max_err, 2e-5) << "chunk rows " << chunk_rows << " threads " << nth;
                    if (chunk_rows == 512) {
                        EXPECT_EQ(got, first) << "threads " << nth;
                    }
                    if (kernels::attn::converts_ahead({.n_q = c.n_q, .chunk_rows = chunk_rows})) {
                        EXPECT_EQ(run_kernel(c, d, scale, chunk_rows, nth, true), got) << "converted ahead";
                    }
                }
        }
}

TEST(Attention, ConvertingAheadGivesTheSameBits) {
    // a prefill's query tiles read K and V converted once; each unit converting its own blocks
    // must give the same bits (heads of different lengths, a partial last block, GQA)
    for (const Case & c : {Case{70, 4, 4, 32, {200, 71, 150, 90}}, Case{40, 9, 3, 64, {1100, 613, 1100}},
                           Case{17, 14, 2, 72, {129, 64}}}) {
        const Data d = make_data(c, 7);
        for (int64_t chunk_rows : {512, 64})
            for (int nth : {1, 3}) {
                const auto plain = run_kernel(c, d, 0.125f, chunk_rows, nth);
                const auto ahead = run_kernel(c, d, 0.125f, chunk_rows, nth, true);
                ASSERT_EQ(plain.size(), ahead.size());
                EXPECT_EQ(std::memcmp(plain.data(), ahead.data(), plain.size() * sizeof(float)), 0)
                    << "n_q " << c.n_q << " chunk rows " << chunk_rows << " threads " << nth;
            }
    }
}

TEST(Attention, AQueryRowGetsTheSameBitsAloneOrInABatch) {
    // decode (one row: F16 rows read in place where the GQA group fits one micro-tile) and a batch
    // containing that row compute it with the same arithmetic
    for (const Case & c : {Case{16, 9, 3, 64, {1500, 1500, 1500}},  // GQA 3 (smollm2-135m)
                           Case{16, 8, 2, 32, {700, 130}},          // GQA 4, head_dim 32, a partial block
                           Case{16, 14, 2, 64, {1100, 600}},        // GQA 7 (qwen2.5): two micro-tiles
                           Case{16, 4, 1, 256, {900}}}) {           // head_dim 256 (gemma3)
        SCOPED_TRACE("GQA " + std::to_string(c.n_head / c.n_head_kv) + ", head_dim " + std::to_string(c.head_dim));
        const Data d = make_data(c, 99);
        const auto all = run_kernel(c, d, 0.125f, 512, 2);
        Case one = c;
        one.n_q = 1;
        Data last = d;
        const size_t row = size_t(c.n_head) * c.head_dim;
        last.q.assign(d.q.end() - ptrdiff_t(row), d.q.end());
        last.q_pos = {d.q_pos.back()};
        for (int nth : {1, 2})
            EXPECT_EQ(run_kernel(one, last, 0.125f, 512, nth),
                      std::vector<float>(all.end() - ptrdiff_t(row), all.end()));
    }
}

}  // namespace
}  // namespace kvlab
