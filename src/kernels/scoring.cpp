// Built with -ffast-math (CMakeLists.txt) so that the dot products and exp loops
// vectorise; nothing here relies on infinities or NaNs.
#include "kernels/scoring.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "kvlab/error.h"

namespace kvlab::kernels {

namespace {

constexpr int k_lanes = 16;
constexpr int k_block = 32;  // keys per register block
constexpr int k_kv = k_block / k_lanes;
constexpr int k_max_vecs = 12;  // query vectors (rows x heads of a group) sharing one pass over the keys
typedef float v16 __attribute__((vector_size(k_lanes * sizeof(float))));
typedef float v16u __attribute__((vector_size(k_lanes * sizeof(float)), aligned(alignof(float))));  // unaligned

// Scores of NG query vectors (qs [NG][d], pre-scaled) against keys [0, vis) of kt
// ([d][nk_pad], k_block-padded) into p [NG][nk_pad]: the accumulators stay in registers.
template <int NG>
void block_scores(const float * kt, int64_t nk_pad, int64_t vis, const float * qs, int d, float * p) {
    for (int64_t jb = 0; jb < vis; jb += k_block) {
        v16 acc[NG][k_kv] = {};
        for (int e = 0; e < d; ++e) {
            const v16u * kv = reinterpret_cast<const v16u *>(kt + size_t(e) * nk_pad + jb);
            for (int g = 0; g < NG; ++g) {
                const float qe = qs[size_t(g) * d + e];
                for (int t = 0; t < k_kv; ++t) acc[g][t] += qe * kv[t];
            }
        }
        for (int g = 0; g < NG; ++g) std::memcpy(p + size_t(g) * nk_pad + jb, acc[g], sizeof(acc[g]));
    }
}

using BlockScores = void (*)(const float *, int64_t, int64_t, const float *, int, float *);
template <int... N>
constexpr auto block_scores_table(std::integer_sequence<int, N...>) {
    return std::array<BlockScores, sizeof...(N)>{&block_scores<N + 1>...};
}
// block_scores_for[n - 1] handles n vectors
constexpr auto block_scores_for = block_scores_table(std::make_integer_sequence<int, k_max_vecs>{});

float dot(const float * a, const float * b, int d) {
    float s = 0.0f;
    for (int i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

// In place: x[0..n) <- softmax(x); returns nothing. n >= 1.
void softmax(float * x, int64_t n) {
    float m = x[0];
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        x[j] = std::exp(x[j] - m);
        sum += x[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

}  // namespace

std::vector<float> window_attention(const float * q, int64_t q_stride, const float * k, int64_t L, int w, int group,
                                    int d) {
    KVLAB_ASSERT(w >= 1 && w <= L, "window within the prompt");
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> out(size_t(L - w), 0.0f), p(static_cast<size_t>(L));
    for (int g = 0; g < group; ++g)
        for (int r = 0; r < w; ++r) {
            const float * qr = q + r * q_stride + g * d;
            const int64_t n = L - w + r + 1;  // keys before the window, then the window causally
            for (int64_t j = 0; j < n; ++j) p[j] = dot(qr, k + j * d, d) * scale;
            softmax(p.data(), n);
            for (int64_t j = 0; j < L - w; ++j) out[j] += p[j];
        }
    const float inv = 1.0f / float(group);
    for (float & x : out) x *= inv;
    return out;
}

std::vector<float> pool1d(const std::vector<float> & x, int kernel, Pool pool) {
    if (pool == Pool::none || kernel <= 1 || x.empty()) return x;
    KVLAB_ASSERT(kernel % 2 == 1, "pooling kernel is odd");
    const int64_t n = int64_t(x.size()), h = kernel / 2;
    std::vector<float> y(x.size());
    for (int64_t j = 0; j < n; ++j) {
        const int64_t a = std::max<int64_t>(0, j - h), b = std::min<int64_t>(n - 1, j + h);
        if (pool == Pool::max) {
            float m = x[a];
            for (int64_t i = a + 1; i <= b; ++i) m = std::max(m, x[i]);
            y[j] = m;
        } else {
            float s = 0.0f;
            for (int64_t i = a; i <= b; ++i) s += x[i];
            y[j] = s / float(kernel);
        }
    }
    return y;
}

namespace {

// The attention scores of n query rows x their group's heads against keys (transposed to
// [d][n_pad]) where row r sees keys [0, visible(r)): the transposed layout makes one query's scores
// over its keys are FMA loops along the keys (vectorised, no horizontal sums), a tile of rows
// x the group's heads sharing each pass over them (block_scores). For each query vector (row
// r, head g of the group), take(r, g, s, vis) gets its scaled scores s[j] = q.k_j / sqrt(d)
// for j < vis (s may be overwritten).
template <class Visible, class Take>
void tiled_scores(const float * q, int64_t q_stride, int64_t n, const TransposedKeys & keys, int group,
                  const Visible & visible, const Take & take) {
    const int d = keys.d;
    const int64_t nk_pad = keys.n_pad;
    const float scale = 1.0f / std::sqrt(float(d));
    // a tile of rows, all their group's heads: up to k_max_vecs query vectors per pass
    const int tile = std::max(1, k_max_vecs / group);
    std::vector<float> p(static_cast<size_t>(tile * group * nk_pad));
    std::vector<float> qs(static_cast<size_t>(tile * group * d));
    for (int64_t r0 = 0; r0 < n; r0 += tile) {
        const int64_t r1 = std::min<int64_t>(n, r0 + tile);
        const int nv = int(r1 - r0) * group;
        for (int64_t r = r0; r < r1; ++r)
            for (int g = 0; g < group; ++g)
                for (int e = 0; e < d; ++e)
                    qs[(size_t(r - r0) * group + g) * d + e] = q[r * q_stride + g * d + e] * scale;
        const int64_t vis_max = visible(r1 - 1);  // the tile's last row sees the most keys
        for (int v0 = 0; v0 < nv; v0 += k_max_vecs) {
            const int nb = std::min(k_max_vecs, nv - v0);
            block_scores_for[nb - 1](keys.kt.data(), nk_pad, vis_max, qs.data() + size_t(v0) * d, d,
                                     p.data() + size_t(v0) * nk_pad);
        }
        for (int v = 0; v < nv; ++v)
            take(r0 + v / group, v % group, p.data() + size_t(v) * nk_pad, visible(r0 + v / group));
    }
}

float max_of(const float * s, int64_t n) {
    float m = s[0];
    for (int64_t j = 1; j < n; ++j) m = std::max(m, s[j]);
    return m;
}

}  // namespace

void accumulate_column_sums(const float * q, int64_t q_stride, int64_t n, int64_t p0, const float * k, int group, int d,
                            float * col) {
    const float inv = 1.0f / float(group);
    tiled_scores(
        q, q_stride, n, TransposedKeys(k, p0 + n, d), group, [p0](int64_t r) { return p0 + r + 1; },
        [&](int64_t, int, float * e, int64_t vis) {
            const float m = max_of(e, vis);
            float sum = 0.0f;
            for (int64_t j = 0; j < vis; ++j) {
                e[j] = std::exp(e[j] - m);
                sum += e[j];
            }
            const float w = inv / sum;
            for (int64_t j = 0; j < vis; ++j) col[j] += e[j] * w;
        });
}

std::vector<float> last_query_attention(const float * q, const float * k, int64_t L, int d) {
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> p(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) p[j] = dot(q, k + j * d, d) * scale;
    softmax(p.data(), L);
    return p;
}

TransposedKeys::TransposedKeys(const float * k, int64_t n_keys, int dim)
    : kt(static_cast<size_t>(dim * ((n_keys + k_block - 1) / k_block * k_block)), 0.0f),
      n(n_keys),
      n_pad((n_keys + k_block - 1) / k_block * k_block),
      d(dim) {
    for (int64_t j = 0; j < n; ++j)
        for (int e = 0; e < d; ++e) kt[size_t(e) * n_pad + j] = k[j * d + e];
}

void restricted_max_attention(const float * q, int64_t q_stride, int64_t n, int64_t r0, const TransposedKeys & kt,
                              int64_t n_fixed, int64_t n_rep, int group, float * best, const float * row_weight,
                              const float * key_weight) {
    KVLAB_ASSERT(kt.n == n_fixed + n_rep, "the restricted keys are the fixed and the repeat keys");
    // in the log domain: log p_j = s_j - (max + log sum), so the exps are summed, never
    // stored, and the max over queries is a subtraction and a max per key; with weights, the
    // rows' (log w_r) before the max over rows, the keys' (per head of the group) after it
    const int n_best = key_weight ? group : 1;
    std::vector<float> log_best(static_cast<size_t>(n_best * n_fixed), std::numeric_limits<float>::lowest());
    tiled_scores(
        q, q_stride, n, kt, group, [&](int64_t r) { return n_fixed + std::min(n_rep, r0 + r + 1); },
        [&](int64_t r, int g, const float * s, int64_t vis) {
            const float m = max_of(s, vis);
            float sum = 0.0f;
            for (int64_t j = 0; j < vis; ++j) sum += std::exp(s[j] - m);
            const float c = m + std::log(sum) - (row_weight ? std::log(row_weight[r]) : 0.0f);
            float * lb = log_best.data() + (key_weight ? g * n_fixed : 0);
            for (int64_t j = 0; j < n_fixed; ++j) lb[j] = std::max(lb[j], s[j] - c);
        });
    for (int g = 0; g < n_best; ++g)
        for (int64_t j = 0; j < n_fixed; ++j)
            best[j] = std::max(best[j],
                               std::exp(log_best[g * n_fixed + j]) * (key_weight ? key_weight[g * n_fixed + j] : 1.0f));
}

void restricted_max_attention(const float * q, int64_t q_stride, int64_t n, int64_t r0, const float * k,
                              int64_t n_fixed, int64_t n_rep, int group, int d, float * best) {
    restricted_max_attention(q, q_stride, n, r0, TransposedKeys(k, n_fixed + n_rep, d), n_fixed, n_rep, group, best);
}

std::vector<float> negative_key_norms(const float * k, int64_t L, int d) {
    std::vector<float> s(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) s[j] = -std::sqrt(dot(k + j * d, k + j * d, d));
    return s;
}

std::vector<float> keydiff(const float * k, int64_t L, int d) {
    std::vector<float> m(size_t(d), 0.0f), norm(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) {
        norm[j] = std::max(std::sqrt(dot(k + j * d, k + j * d, d)), 1e-12f);
        for (int i = 0; i < d; ++i) m[i] += k[j * d + i] / norm[j];
    }
    for (float & x : m) x /= float(L);
    const float mn = std::max(std::sqrt(dot(m.data(), m.data(), d)), 1e-12f);
    std::vector<float> s(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) s[j] = -dot(k + j * d, m.data(), d) / (norm[j] * mn);
    return s;
}

std::vector<float> expected_attention(const float * mu, const float * sigma, const float * k, const float * v,
                                      int64_t L, int64_t n_sink, int group, int d, bool use_covariance,
                                      bool use_vnorm) {
    n_sink = std::clamp<int64_t>(n_sink, 0, L);
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> out(size_t(L), 0.0f), p(static_cast<size_t>(L)), sk(static_cast<size_t>(d));
    for (int g = 0; g < group; ++g) {
        const float * m = mu + g * d;
        const float * sg = sigma + size_t(g) * d * d;
        for (int64_t j = n_sink; j < L; ++j) {
            const float * kj = k + j * d;
            float x = dot(m, kj, d) * scale;
            if (use_covariance) {
                for (int a = 0; a < d; ++a) sk[a] = dot(sg + a * d, kj, d);
                x += dot(kj, sk.data(), d) / (2.0f * float(d));
            }
            p[j] = x;
        }
        if (L == n_sink) break;
        softmax(p.data() + n_sink, L - n_sink);  // over the non-sink keys only, as kvpress
        for (int64_t j = n_sink; j < L; ++j) out[j] += p[j] / float(group);
    }
    if (use_vnorm)
        for (int64_t j = n_sink; j < L; ++j) out[j] *= std::sqrt(dot(v + j * d, v + j * d, d));
    return out;
}

std::vector<int32_t> top_rows(const float * scores, int64_t n_rows, int64_t n) {
    n = std::clamp<int64_t>(n, 0, n_rows);
    std::vector<int32_t> idx(static_cast<size_t>(n_rows));
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
    std::nth_element(idx.begin(), idx.begin() + n, idx.end(), better);
    idx.resize(static_cast<size_t>(n));
    std::sort(idx.begin(), idx.end());
    return idx;
}

}  // namespace kvlab::kernels
