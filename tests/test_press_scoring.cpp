// kvlab's compression scoring primitives (press/scoring.h) and budget policies
// (press/policy.h) against plain double-precision references written from docs/methods.md and
// the headers' comments, on seeded random tensors (d = 64 and 72, GQA groups 1 and 3 (5, 8 for
// column sums), padded query strides). Float scores are compared normwise: max_j |got_j - ref_j| /
// max_j |ref_j| <= 1e-5 (relative to the largest reference score, not per element).
// Integer results (pooled maxima, row sets, budgets) must match exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab {
namespace {

using kernels::Pool;
using Vd = std::vector<double>;

std::vector<float> randn(std::mt19937_64 & rng, size_t n, float scale = 1.0f, float offset = 0.0f) {
    std::normal_distribution<float> nd(offset, scale);
    std::vector<float> x(n);
    for (float & v : x) v = nd(rng);
    return x;
}

double rel_err(const std::vector<float> & got, const Vd & ref) {
    double err = 0, mx = 1e-300;
    for (size_t i = 0; i < ref.size(); ++i) {
        err = std::max(err, std::abs(double(got[i]) - ref[i]));
        mx = std::max(mx, std::abs(ref[i]));
    }
    return err / mx;
}

double dot(const float * a, const float * b, int d) {
    double s = 0;
    for (int e = 0; e < d; ++e) s += double(a[e]) * b[e];
    return s;
}

Vd softmax(Vd x) {
    double m = -INFINITY, z = 0;
    for (double v : x) m = std::max(m, v);
    for (double & v : x) z += (v = std::exp(v - m));
    for (double & v : x) v /= z;
    return x;
}

// Group-mean causal attention of query rows (row r at position pos0 + r sees keys
// [0, pos0 + r]) added into out[j] for j < out.size().
void ref_causal(const float * q, int64_t qs, int64_t n, int64_t pos0, const float * k, int group, int d, Vd & out) {
    for (int64_t r = 0; r < n; ++r)
        for (int g = 0; g < group; ++g) {
            Vd lg(size_t(pos0 + r + 1));
            for (size_t j = 0; j < lg.size(); ++j) lg[j] = dot(q + r * qs + g * d, k + j * d, d) / std::sqrt(double(d));
            const Vd p = softmax(lg);
            for (size_t j = 0; j < out.size() && j < p.size(); ++j) out[j] += p[j] / group;
        }
}

TEST(PressScoring, WindowAttentionMatchesReference) {
    struct C {
        int64_t L;
        int w, group, d;
    };
    const C cases[] = {{1, 1, 1, 64},   {2, 1, 3, 64},    {9, 9, 3, 72},    {40, 8, 1, 72},
                       {33, 32, 3, 64}, {100, 32, 3, 72}, {300, 32, 1, 64}, {257, 7, 3, 64}};
    for (const C & c : cases)
        for (int64_t pad : {0, 13}) {
            std::mt19937_64 rng(1000 + c.L * 31 + c.w + pad);
            const int64_t qs = int64_t(c.group) * c.d + pad;
            const auto q = randn(rng, size_t(c.w * qs), 2.0f), k = randn(rng, size_t(c.L * c.d));
            const auto got = kernels::window_attention(q.data(), qs, k.data(), c.L, c.w, c.group, c.d);
            Vd ref(size_t(c.L - c.w), 0.0);
            ref_causal(q.data(), qs, c.w, c.L - c.w, k.data(), c.group, c.d, ref);
            ASSERT_EQ(got.size(), ref.size()) << "L=" << c.L << " w=" << c.w;
            if (!ref.empty()) {
                EXPECT_LE(rel_err(got, ref), 1e-5) << "L=" << c.L << " w=" << c.w << " pad=" << pad;
            }
        }
}

Vd ref_pool(const std::vector<float> & x, int kernel, bool is_max) {
    const int64_t n = int64_t(x.size()), h = kernel / 2;
    Vd out(x.size());
    for (int64_t i = 0; i < n; ++i) {
        double acc = is_max ? -INFINITY : 0.0;
        for (int64_t j = std::max<int64_t>(0, i - h); j <= std::min(n - 1, i + h); ++j)
            acc = is_max ? std::max(acc, double(x[j])) : acc + x[j];
        out[i] = is_max ? acc : acc / kernel;
    }
    return out;
}

// KVzip's restricted softmax (fast: blocked over transposed keys) against a plain double loop.
TEST(PressScoring, RestrictedMaxAttentionMatchesReference) {
    struct Case {
        int64_t n, r0, n_fixed, n_rep;
        int group, d;
    };
    for (const Case c : {Case{37, 0, 50, 37, 3, 64}, Case{20, 17, 9, 37, 7, 64}, Case{5, 2, 1, 7, 1, 16},
                         Case{64, 0, 130, 64, 2, 32}}) {
        std::mt19937_64 rng(99 + c.n * 7 + c.group);
        const int64_t qs = int64_t(c.group + 1) * c.d;  // a stride wider than the group
        const auto q = randn(rng, size_t(c.n * qs), 2.0f), k = randn(rng, size_t((c.n_fixed + c.n_rep) * c.d));
        std::vector<float> best(size_t(c.n_fixed), 0.0f);
        kernels::restricted_max_attention(q.data(), qs, c.n, c.r0, k.data(), c.n_fixed, c.n_rep, c.group, c.d,
                                          best.data());
        std::vector<double> want(size_t(c.n_fixed), 0.0);
        for (int64_t r = 0; r < c.n; ++r)
            for (int g = 0; g < c.group; ++g) {
                const int64_t vis = c.n_fixed + std::min(c.n_rep, c.r0 + r + 1);
                std::vector<double> l(static_cast<size_t>(vis));
                double m = -1e300, sum = 0.0;
                for (int64_t j = 0; j < vis; ++j) {
                    double dot = 0.0;
                    for (int e = 0; e < c.d; ++e) dot += double(q[r * qs + g * c.d + e]) * double(k[j * c.d + e]);
                    m = std::max(m, l[j] = dot / std::sqrt(double(c.d)));
                }
                for (double & x : l) sum += (x = std::exp(x - m));
                for (int64_t j = 0; j < c.n_fixed; ++j) want[j] = std::max(want[j], l[j] / sum);
            }
        for (int64_t j = 0; j < c.n_fixed; ++j) EXPECT_NEAR(best[j], want[j], 2e-5) << c.n << " " << j;
    }
}

TEST(PressScoring, Pool1dMatchesReference) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    for (size_t n : {1, 2, 3, 6, 50, 301}) {
        const auto x = randn(rng, n);  // negative values: zero padding would show in max
        std::vector<float> u(n);
        for (float & v : u) v = ud(rng);
        for (int kernel : {1, 3, 5, 7, 9}) {
            const auto mx = kernels::pool1d(x, kernel, kernels::Pool::max),
                       av = kernels::pool1d(u, kernel, kernels::Pool::avg);
            const Vd rmx = ref_pool(x, kernel, true), rav = ref_pool(u, kernel, false);
            ASSERT_EQ(mx.size(), n);
            ASSERT_EQ(av.size(), n);
            for (size_t i = 0; i < n; ++i) {
                EXPECT_EQ(mx[i], float(rmx[i])) << "n=" << n << " k=" << kernel << " i=" << i;
                EXPECT_NEAR(av[i], rav[i], 1e-6) << "n=" << n << " k=" << kernel << " i=" << i;
            }
            EXPECT_EQ(kernels::pool1d(x, kernel, kernels::Pool::none), x);
        }
        EXPECT_EQ(kernels::pool1d(x, 1, kernels::Pool::max), x);
        EXPECT_EQ(kernels::pool1d(u, 1, kernels::Pool::avg), u);
    }
}

TEST(PressScoring, ColumnSumsChunkedMatchReference) {
    struct C {
        int64_t n, p0;
        int group, d;
    };
    const C cases[] = {{1, 0, 1, 64},   {50, 0, 3, 72}, {130, 20, 3, 64},
                       {200, 5, 1, 72}, {70, 3, 5, 64}, {65, 0, 8, 72}};
    for (const C & c : cases) {
        std::mt19937_64 rng(2000 + c.n + c.p0);
        const int64_t qs = int64_t(c.group) * c.d + 3, n_keys = c.p0 + c.n + 4;  // trailing keys unseen
        const auto q = randn(rng, size_t(c.n * qs), 2.0f), k = randn(rng, size_t(n_keys * c.d));
        std::uniform_real_distribution<float> ud(0.0f, 0.5f);
        std::vector<float> base(static_cast<size_t>(n_keys));
        for (float & v : base) v = ud(rng);  // "added into": the initial values stay
        Vd ref(base.begin(), base.end());
        ref_causal(q.data(), qs, c.n, c.p0, k.data(), c.group, c.d, ref);
        std::vector<float> one = base;
        kernels::accumulate_column_sums(q.data(), qs, c.n, c.p0, k.data(), c.group, c.d, one.data());
        EXPECT_LE(rel_err(one, ref), 1e-5) << "n=" << c.n << " p0=" << c.p0;
        const Vd one_d(one.begin(), one.end());
        for (int64_t chunk : {1, 7, 64}) {
            std::vector<float> col = base;
            for (int64_t s = 0; s < c.n; s += chunk)
                kernels::accumulate_column_sums(q.data() + s * qs, qs, std::min(chunk, c.n - s), c.p0 + s, k.data(),
                                                c.group, c.d, col.data());
            EXPECT_LE(rel_err(col, ref), 1e-5) << "n=" << c.n << " chunk=" << chunk;
            EXPECT_LE(rel_err(col, one_d), 1e-5) << "n=" << c.n << " chunk=" << chunk;
        }
    }
}

TEST(PressScoring, PerKeyScoresMatchReference) {
    for (int d : {64, 72})
        for (int64_t L : {1, 2, 37, 300}) {
            std::mt19937_64 rng(3000 + d * 1000 + L);
            const auto q = randn(rng, size_t(d), 2.0f), k = randn(rng, size_t(L * d));
            const auto kd = randn(rng, size_t(L * d), 1.0f, 0.4f);  // a common direction: cosines spread
            Vd att(static_cast<size_t>(L)), norm(att), diff(att), m(static_cast<size_t>(d), 0.0);
            for (int64_t j = 0; j < L; ++j) {
                att[j] = dot(q.data(), k.data() + j * d, d) / std::sqrt(double(d));
                norm[j] = -std::sqrt(dot(k.data() + j * d, k.data() + j * d, d));
                const double nj = std::sqrt(dot(kd.data() + j * d, kd.data() + j * d, d));
                for (int e = 0; e < d; ++e) m[e] += kd[j * d + e] / nj / double(L);
            }
            att = softmax(att);
            double mn = 0;
            for (double v : m) mn += v * v;
            mn = std::sqrt(mn);
            for (int64_t j = 0; j < L; ++j) {
                double kn = 0, km = 0;
                for (int e = 0; e < d; ++e) kn += double(kd[j * d + e]) * kd[j * d + e], km += kd[j * d + e] * m[e];
                diff[j] = -km / (std::sqrt(kn) * mn);
            }
            const auto got_att = kernels::last_query_attention(q.data(), k.data(), L, d);
            const auto got_norm = kernels::negative_key_norms(k.data(), L, d);
            const auto got_diff = kernels::keydiff(kd.data(), L, d);
            ASSERT_EQ(got_att.size(), size_t(L));
            ASSERT_EQ(got_norm.size(), size_t(L));
            ASSERT_EQ(got_diff.size(), size_t(L));
            EXPECT_LE(rel_err(got_att, att), 1e-5) << "d=" << d << " L=" << L;
            EXPECT_LE(rel_err(got_norm, norm), 1e-5) << "d=" << d << " L=" << L;
            EXPECT_LE(rel_err(got_diff, diff), 1e-5) << "d=" << d << " L=" << L;
        }
}

TEST(PressScoring, ExpectedAttentionMatchesReference) {
    struct C {
        int64_t L;
        int group, d;
    };
    const C cases[] = {{1, 1, 64}, {50, 3, 72}, {300, 3, 64}, {120, 1, 72}, {4, 3, 64}, {5, 3, 64}};
    for (const C & c : cases) {
        const int d = c.d;
        std::mt19937_64 rng(4000 + c.L + c.group);
        const auto mu = randn(rng, size_t(c.group) * d, 1.5f);
        const auto k = randn(rng, size_t(c.L * d)), v = randn(rng, size_t(c.L * d));
        std::vector<float> sigma(size_t(c.group) * d * d);  // 8/d A A^T: symmetric PSD
        for (int g = 0; g < c.group; ++g) {
            const auto a = randn(rng, size_t(d) * d);
            for (int i = 0; i < d; ++i)
                for (int j = 0; j < d; ++j)
                    sigma[(size_t(g) * d + i) * d + j] = float(8.0 / d * dot(&a[size_t(i) * d], &a[size_t(j) * d], d));
        }
        const int64_t n_sink = std::min<int64_t>(4, c.L - 1);  // L = 4: one key after 3 sinks
        Vd prev;
        for (bool cov : {false, true})
            for (bool vn : {false, true}) {
                // the softmax over keys [n_sink, L) only; the sinks score 0
                Vd ref(size_t(c.L), 0.0);
                for (int g = 0; g < c.group; ++g) {
                    Vd lg(size_t(c.L - n_sink));
                    for (int64_t j = n_sink; j < c.L; ++j) {
                        const float * kj = k.data() + j * d;
                        double & x = lg[size_t(j - n_sink)];
                        x = dot(mu.data() + g * d, kj, d) / std::sqrt(double(d));
                        if (!cov) continue;
                        double quad = 0;
                        for (int a = 0; a < d; ++a) quad += kj[a] * dot(&sigma[(size_t(g) * d + a) * d], kj, d);
                        x += quad / (2.0 * d);
                    }
                    const Vd p = softmax(lg);
                    for (int64_t j = n_sink; j < c.L; ++j) ref[j] += p[size_t(j - n_sink)] / c.group;
                }
                if (vn)
                    for (int64_t j = 0; j < c.L; ++j) ref[j] *= std::sqrt(dot(&v[j * d], &v[j * d], d));
                if (!vn && cov && c.L - n_sink > 1) {  // the covariance term must matter, or the check is void
                    const std::vector<float> nocov(prev.begin(), prev.end());
                    EXPECT_GT(rel_err(nocov, ref), 1e-2);
                }
                if (!vn) prev = ref;
                const auto got = kernels::expected_attention(mu.data(), sigma.data(), k.data(), v.data(), c.L, n_sink,
                                                             c.group, d, cov, vn);
                ASSERT_EQ(got.size(), size_t(c.L));
                for (int64_t j = 0; j < n_sink; ++j) EXPECT_EQ(got[j], 0.0f);
                EXPECT_LE(rel_err(got, ref), 1e-5)
                    << "L=" << c.L << " group=" << c.group << " cov=" << cov << " vnorm=" << vn;
            }
    }
}

// Indices of the n best scores (ties to the lower index), ascending.
std::vector<int32_t> ref_top(const std::vector<float> & s, int64_t n) {
    std::vector<int32_t> idx(s.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
    idx.resize(size_t(std::clamp<int64_t>(n, 0, int64_t(s.size()))));
    std::sort(idx.begin(), idx.end());
    return idx;
}

TEST(PressScoring, TopRowsTiesAndClamping) {
    const std::vector<float> hand = {1, 3, 3, 2, 3};
    EXPECT_EQ(kernels::top_rows(hand.data(), 5, 2), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(kernels::top_rows(hand.data(), 5, 3), (std::vector<int32_t>{1, 2, 4}));
    EXPECT_EQ(kernels::top_rows(hand.data(), 5, 4), (std::vector<int32_t>{1, 2, 3, 4}));
    std::mt19937_64 rng(5);
    std::uniform_int_distribution<int> small(0, 3);
    for (int64_t rows : {1, 5, 40, 300})
        for (bool ties : {true, false}) {
            std::vector<float> s = randn(rng, size_t(rows));
            if (ties)
                for (float & x : s) x = float(small(rng));
            for (int64_t n : {int64_t(-2), int64_t(0), int64_t(1), rows / 2, rows - 1, rows, rows + 3})
                EXPECT_EQ(kernels::top_rows(s.data(), rows, n), ref_top(s, n)) << "rows=" << rows << " n=" << n;
        }
}

std::vector<int64_t> ref_pyramid(int64_t L, int64_t B, int64_t w, int N, int64_t beta) {
    if (L <= B) return std::vector<int64_t>(size_t(N), L);
    const int64_t b = B - w;
    if (L < 2 * b) return std::vector<int64_t>(size_t(N), B);
    int64_t mn = b / beta, mx = 2 * b - mn;
    if (mx >= L - w) mx = L - w, mn = 2 * b - mx;
    const int64_t step = (mx - mn) / (N - 1);
    std::vector<int64_t> out;
    for (int l = 0; l < N; ++l) out.push_back(mx - l * step + w);
    return out;
}

// kvpress keeps int(L * (1 - cr)) rows (kvpress/utils.py); the values are Python's own.
TEST(PressScoring, RatioKeepsWhatKvpressKeeps) {
    struct C {
        int64_t L;
        double cr;
        int64_t kept;  // int(L * (1 - cr)) in Python
    };
    for (const C & c : {C{1539, 0.5, 769}, C{100, 0.3, 70}, C{2000, 0.875, 250}, C{2000, 0.5, 1000}, C{1536, 0.9, 153},
                        C{150, 0.7, 45}, C{7, 0.75, 1}, C{10, 0.0, 10}})
        EXPECT_EQ(Budget::from_ratio(c.cr).per_layer(c.L), c.kept) << c.L << " " << c.cr;
}

TEST(PressScoring, KvpressPresetSetsTheMethodsParametersAndParamsOverrideIt) {
    EXPECT_EQ(apply_preset("", "snapkv", {{"window", "8"}}), (ParamMap{{"window", "8"}}));
    EXPECT_EQ(apply_preset("kvpress", "snapkv", {}), (ParamMap{{"kernel", "5"}, {"pooling", "avg"}, {"window", "64"}}));
    EXPECT_EQ(apply_preset("kvpress", "snapkv", {{"window", "16"}}),
              (ParamMap{{"kernel", "5"}, {"pooling", "avg"}, {"window", "16"}}));
    EXPECT_EQ(apply_preset("kvpress", "h2o", {}), (ParamMap{{"normalize", "true"}, {"recent", "0"}}));
    EXPECT_EQ(apply_preset("kvpress", "knorm", {}), ParamMap{});
    EXPECT_THROW(apply_preset("kvpres", "snapkv", {}), Error);
    // every method's preset names only parameters the method takes
    for (const MethodInfo & m : press_methods())
        for (const auto & [k, v] : m.kvpress_params) {
            bool known = k == "base" && m.wrapper;
            for (const ParamSpec & p : m.params) known = known || p.name == k;
            if (m.wrapper)
                for (const ParamSpec & p : press::find_method("snapkv")->info.params) known = known || p.name == k;
            EXPECT_TRUE(known) << m.name << ": " << k;
        }
}

// The expected budgets are kvpress 0.5.5's own PyramidKVPress.get_layer_budget (window 64,
// beta 20) on a stand-in module, one call per layer.
TEST(PressScoring, PyramidBudgetsUnderTheKvpressRuleAreKvpresss) {
    const std::vector<int64_t> half = {1936, 1871, 1807, 1742, 1678, 1613, 1549, 1484, 1420, 1355,
                                       1290, 1226, 1161, 1097, 1032, 968,  903,  839,  774,  710,
                                       645,  580,  516,  451,  387,  322,  258,  193,  129,  64};
    EXPECT_EQ(press::pyramid_budgets_kvpress(2000, 1.0 - 0.5, 64, 30, 20), half);
    EXPECT_EQ(press::pyramid_budgets_kvpress(2000, 1.0 - 0.875, 64, 30, 20), std::vector<int64_t>(30, 250));
    EXPECT_EQ(press::pyramid_budgets_kvpress(751, 1.0 - 0.75, 64, 30, 20), std::vector<int64_t>(30, 188));
    EXPECT_EQ(press::pyramid_budgets_kvpress(100, 1.0 - 0.5, 64, 4, 20), std::vector<int64_t>(4, 50));
    const std::vector<int64_t> odd = {1937, 1856, 1774, 1693, 1611, 1530, 1448, 1367, 1286, 1204, 1123, 1041,
                                      960,  878,  797,  715,  634,  553,  471,  390,  308,  227,  145,  64};
    EXPECT_EQ(press::pyramid_budgets_kvpress(2001, 1.0 - 0.5, 64, 24, 20), odd);
}

// kvpress's AdaKVPress rule by hand: 2 heads of 5 candidates.
TEST(PressScoring, AdaKvBudgetsUnderTheKvpressRule) {
    const std::vector<std::vector<float>> s = {{0.9f, 0.8f, 0.7f, 0.6f, 0.5f}, {0.05f, 0.04f, 0.03f, 0.02f, 0.95f}};
    // b 2 (4 kept), safe 1: each head keeps its top (0.9, 0.95), the 2 left go to 0.8 and 0.7 of head 0
    EXPECT_EQ(press::adakv_head_budgets_kvpress(s, 2, 1), (std::vector<int64_t>{3, 1}));
    // safe = b: each head keeps its own top b
    EXPECT_EQ(press::adakv_head_budgets_kvpress(s, 2, 2), (std::vector<int64_t>{2, 2}));
    // safe 0: the global top 4 of all ten (0.95 of head 1, then head 0's best three)
    EXPECT_EQ(press::adakv_head_budgets_kvpress(s, 2, 0), (std::vector<int64_t>{3, 1}));
    // b 3, safe 0: 0.95, 0.9 .. 0.5: head 0 keeps all five
    EXPECT_EQ(press::adakv_head_budgets_kvpress(s, 3, 0), (std::vector<int64_t>{5, 1}));
    // b past the rows: everything
    EXPECT_EQ(press::adakv_head_budgets_kvpress(s, 9, 1), (std::vector<int64_t>{5, 5}));
}

TEST(PressScoring, PyramidBudgetsMatchFormula) {
    const auto lit = press::pyramid_budgets(751, 188, 32, 30, 20);  // min 7, max 305, step 298//29 = 10
    ASSERT_EQ(lit.size(), 30u);
    EXPECT_EQ(lit.front(), 337);
    EXPECT_EQ(lit.back(), 47);
    EXPECT_EQ(lit[0] - lit[1], 10);
    const auto clamp = press::pyramid_budgets(320, 188, 32, 30, 20);  // max = L-w = 288, min 24, step 9
    ASSERT_EQ(clamp.size(), 30u);
    EXPECT_EQ(clamp.front(), 320);
    EXPECT_EQ(clamp.back(), 59);
    EXPECT_EQ(press::pyramid_budgets(300, 188, 32, 4, 20), (std::vector<int64_t>{188, 188, 188, 188}));
    EXPECT_EQ(press::pyramid_budgets(100, 188, 32, 3, 20), (std::vector<int64_t>{100, 100, 100}));
    for (int64_t L : {10, 100, 187, 188, 189, 300, 311, 312, 313, 320, 500, 751, 2000, 10000})
        for (int64_t B : {40, 64, 188, 512})
            for (int64_t w : {8, 32})
                for (int N : {2, 24, 30, 32})
                    for (int64_t beta : {5, 20}) {
                        if (B <= w) continue;
                        EXPECT_EQ(press::pyramid_budgets(L, B, w, N, beta), ref_pyramid(L, B, w, N, beta))
                            << "L=" << L << " B=" << B << " w=" << w << " N=" << N << " beta=" << beta;
                    }
}

using Mat = std::vector<std::vector<float>>;

// Per head: its rows ordered best first (ties to the lower row), and n_h of the global top.
std::vector<int64_t> global_counts(const Mat & s, int64_t total, std::vector<std::vector<int32_t>> * order) {
    std::vector<std::pair<float, int>> all;
    for (size_t h = 0; h < s.size(); ++h) {
        for (float x : s[h]) all.push_back({x, int(h)});
        order->push_back(ref_top(s[h], int64_t(s[h].size())));
        std::stable_sort(order->back().begin(), order->back().end(),
                         [&](int32_t a, int32_t b) { return s[h][a] > s[h][b]; });
    }
    std::stable_sort(all.begin(), all.end(), [](auto & a, auto & b) { return a.first > b.first; });
    std::vector<int64_t> n(s.size(), 0);
    for (int64_t i = 0; i < total; ++i) ++n[size_t(all[i].second)];
    return n;
}

TEST(PressScoring, AdaKvHeadBudgets) {
    // Hand case: H=3, b=5, alpha=0.2: the global top 15 holds 8 of head 0 and 7 of head 1,
    // b_h = round(0.8 n_h + 1) = (7.4, 6.6, 1) -> (7, 7, 1), already summing to 15.
    Mat hand(3, std::vector<float>(12));
    for (int h = 0; h < 3; ++h)
        for (int j = 0; j < 12; ++j) hand[h][j] = -1.0f - 0.01f * float(h * 12 + j);
    for (int j = 0; j < 8; ++j) hand[0][j] = 20.0f - 0.1f * j;
    for (int j = 0; j < 7; ++j) hand[1][j] = 19.95f - 0.1f * j;
    EXPECT_EQ(press::adakv_head_budgets(hand, 5, 0.2), (std::vector<int64_t>{7, 7, 1}));

    std::mt19937_64 rng(6);
    int exact = 0, adjusted = 0;
    for (int H : {1, 2, 4, 8})
        for (int64_t rows : {1, 5, 60, 300})
            for (int64_t b : {int64_t(0), int64_t(1), int64_t(3), rows / 2, rows - 1, rows, rows + 5})
                for (double alpha : {0.0, 0.2, 0.4, 1.0}) {  // no exact .5 in n_h (1 - alpha)
                    Mat s;
                    for (int h = 0; h < H; ++h) s.push_back(randn(rng, size_t(rows), 1.0f + h, 0.3f * h));
                    const auto got = press::adakv_head_budgets(s, b, alpha);
                    const std::string at = "H=" + std::to_string(H) + " rows=" + std::to_string(rows) +
                                           " b=" + std::to_string(b) + " alpha=" + std::to_string(alpha);
                    ASSERT_EQ(got.size(), size_t(H)) << at;
                    if (b >= rows) {
                        EXPECT_EQ(got, std::vector<int64_t>(size_t(H), rows)) << at;
                        continue;
                    }
                    const int64_t floor_b = int64_t(std::floor(alpha * double(b)));
                    EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t(0)), H * b) << at;
                    for (int64_t x : got) EXPECT_TRUE(x >= floor_b && x <= rows) << at << " b_h=" << x;
                    std::vector<std::vector<int32_t>> order;
                    const auto n = global_counts(s, H * b, &order);
                    std::vector<int64_t> f;
                    for (int64_t nh : n) f.push_back(std::llround(double(nh) * (1.0 - alpha) + double(floor_b)));
                    int64_t sum = std::accumulate(f.begin(), f.end(), int64_t(0));
                    exact += sum == H * b;
                    adjusted += sum != H * b;
                    // The header's adjustment: add the best unselected row over all heads, or
                    // drop the worst selected row of a head above the safeguard.
                    for (; sum < H * b; ++sum) {
                        int best = -1;
                        for (int h = 0; h < H; ++h)
                            if (f[h] < rows && (best < 0 || s[h][order[h][f[h]]] > s[best][order[best][f[best]]]))
                                best = h;
                        ++f[size_t(best)];
                    }
                    for (; sum > H * b; --sum) {
                        int worst = -1;
                        for (int h = 0; h < H; ++h)
                            if (f[h] > floor_b &&
                                (worst < 0 || s[h][order[h][f[h] - 1]] < s[worst][order[worst][f[worst] - 1]]))
                                worst = h;
                        --f[size_t(worst)];
                    }
                    EXPECT_EQ(got, f) << at;
                }
    EXPECT_GT(exact, 50);  // the formula-exact cases ran (alpha 0 and 1 always are)
    EXPECT_GT(adjusted, 5);
}

press::Scores make_scores(std::mt19937_64 & rng, int n_layer, int n_head, int64_t L, int64_t sink, int64_t window,
                          bool per_layer, bool equal_heads) {
    press::Scores s;
    s.L = L, s.n_sink = sink, s.window = window, s.per_layer = per_layer;
    std::uniform_int_distribution<int> q(0, 15);  // coarse values: many ties
    for (int il = 0; il < n_layer; ++il) {
        s.s.emplace_back();
        for (int h = 0; h < n_head; ++h) {
            std::vector<float> x(static_cast<size_t>(L));
            for (float & v : x) v = 0.25f * float(q(rng));
            s.s[il].push_back(equal_heads && h > 0 ? s.s[il][0] : x);
        }
    }
    return s;
}

// Forced rows plus the top n candidate rows by sc (ties to the lower row), ascending.
std::vector<int32_t> ref_keep(const press::Scores & s, const std::vector<float> & sc, int64_t n) {
    std::vector<float> cand(sc);
    for (int64_t j = 0; j < s.L; ++j)
        if (s.is_forced(j)) cand[j] = -INFINITY;
    const auto top = ref_top(cand, std::min(n, s.L - s.forced()));  // forced rows (-inf) come last
    std::vector<int32_t> out;
    for (int64_t j = 0; j < s.L; ++j)
        if (s.is_forced(j) || std::binary_search(top.begin(), top.end(), int32_t(j))) out.push_back(int32_t(j));
    return out;
}

TEST(PressScoring, PerLayerSelectionKeepsForcedRows) {
    struct C {
        int64_t L, sink, window;
    };
    const C cases[] = {{100, 4, 32}, {300, 0, 8}, {50, 4, 0}, {40, 4, 32}};
    std::mt19937_64 rng(8);
    for (const C & c : cases)
        for (int mode = 0; mode < 3; ++mode) {  // per head; per layer with equal heads; per layer
            const bool per_layer = mode > 0;
            const auto s = make_scores(rng, 3, 4, c.L, c.sink, c.window, per_layer, mode == 1);
            const int64_t F = s.forced();
            const std::vector<std::vector<int64_t>> budgets = {
                {F, F + 1, (c.L + F) / 2}, {c.L - 1, c.L, c.L + 10}, {F + 3, c.L - 2, F}};
            for (const auto & B : budgets) {
                const auto plan = press::select_per_layer_budget(s, B);
                ASSERT_EQ(plan.size(), 3u);
                for (int il = 0; il < 3; ++il) {
                    ASSERT_EQ(plan[il].size(), 4u);
                    for (int h = 0; h < 4; ++h) {
                        const auto & rows = plan[il][h];
                        const std::string at = "L=" + std::to_string(c.L) + " mode=" + std::to_string(mode) +
                                               " B=" + std::to_string(B[il]) + " layer " + std::to_string(il) +
                                               " head " + std::to_string(h);
                        EXPECT_EQ(int64_t(rows.size()), std::min(B[il], c.L)) << at;
                        EXPECT_TRUE(std::adjacent_find(rows.begin(), rows.end(), std::greater_equal<int32_t>()) ==
                                    rows.end())
                            << at;
                        for (int64_t j = 0; j < c.L; ++j)
                            if (s.is_forced(j)) {
                                EXPECT_TRUE(std::binary_search(rows.begin(), rows.end(), j)) << at;
                            }
                        if (mode < 2) {
                            EXPECT_EQ(rows, ref_keep(s, s.s[il][h], B[il] - F)) << at;
                        }
                        if (per_layer) {
                            EXPECT_EQ(rows, plan[il][0]) << at;
                        }
                    }
                }
            }
            for (int64_t n : {int64_t(0), int64_t(1), int64_t(10), c.L})
                EXPECT_EQ(press::keep_rows(s, s.s[1][2], n), ref_keep(s, s.s[1][2], n)) << "L=" << c.L << " n=" << n;
        }
    press::Scores s;
    s.L = 100, s.n_sink = 4, s.window = 32;
    s.s.assign(1, std::vector<std::vector<float>>(1, std::vector<float>(100, 0.0f)));
    EXPECT_THROW(press::check_budget(s, 35), Error);
    EXPECT_NO_THROW(press::check_budget(s, 36));
    s.n_sink = 0, s.window = 8;
    EXPECT_THROW(press::check_budget(s, 7), Error);
    EXPECT_NO_THROW(press::check_budget(s, 8));
}

}  // namespace
}  // namespace kvlab
