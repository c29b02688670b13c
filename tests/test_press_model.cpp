// The compression methods on a tiny random-weight model (and the real default model for
// memory): each scorer against a plain double-precision reference computed in this file
// from the cache's keys and the prefill's queries; the plans' kept rows against the
// reference's top rows; the fixed rules (StreamingLLM's set, PyramidKV's and Ada-KV's
// budgets); ratio 0 leaves the logits bit-identical; batched queries on caches whose
// layers and heads differ give the same logits as one token at a time; compaction frees
// memory within the stated bound; bad input is refused with a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "ggml-cpu.h"
#include "ggml.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/session.h"
#include "kvlab/text.h"
#include "press/method.h"
#include "press/policy.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int64_t k_L = 150;    // context tokens
constexpr int k_chunk = 64;     // prefill chunk: H2O's sums must be right across chunks
constexpr double k_rel = 1e-5;  // scores vs reference, relative to the head's largest score

class PressModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 3;
        spec.n_embd = 96;
        spec.n_head = 6;
        spec.n_head_kv = 2;
        spec.head_dim = 16;
        spec.seed = 11;
        spec.weight_type = GGML_TYPE_Q8_0;  // integer dot products: matmuls do not depend on the batch
        tiny_ = test::load_tiny_model(spec, "press", k_L + 40).release();
        model_ = tiny_->model.get();
        tokens_ = &tiny_->tokens;
    }
    static void TearDownTestSuite() { delete tiny_; }
    static std::vector<int32_t> context() { return {tokens_->begin(), tokens_->begin() + k_L}; }
    static std::vector<int32_t> query() { return {tokens_->begin() + k_L, tokens_->end()}; }
    static const HParams & hp() { return model_->hparams(); }

    static KvStore new_cache() { return Engine(*model_).new_cache(k_L); }
    // Prefills the context into `cache` with `obs` (may be null; made for this cache) and
    // a capture of every query, post-RoPE, [layer][token][n_head][head_dim].
    static void prefill(KvStore & cache, const QueryObserver * obs, std::vector<std::vector<float>> * q_all = nullptr) {
        Engine e(*model_, EngineOptions{k_chunk});
        const int64_t per_row = int64_t(hp().n_head) * hp().head_dim;
        if (q_all) q_all->assign(hp().n_layer, std::vector<float>(size_t(k_L * per_row)));
        QueryObserver capture;
        capture.first = 0;
        capture.on_queries = [&](int il, int64_t tok0, int64_t n, const float * q) {
            std::copy(q, q + n * per_row, (*q_all)[il].begin() + tok0 * per_row);
        };
        ObserverSet both(*model_);
        both.add(obs);
        if (q_all) both.add(&capture);
        e.prefill(cache, context(), nullptr, nullptr, both.get());
    }
    // The context prefilled and compressed by `method` (through the context session, which
    // also runs the scoring passes of methods that have them); reserve rows per segment.
    static KvStore compressed(const std::string & method, const Budget & b, const ParamMap & params = {},
                              int64_t reserve = 48) {
        static const Tokenizer tok(model_->path());
        Engine e(*model_, EngineOptions{k_chunk});
        ContextSession s(e, {{method, params}}, SessionOptions{reserve, 0, &tok});
        s.prefill(context());
        return std::move(s.compress(0, b).cache);
    }

    // Every (layer, head) of c holds n rows, among them every row `sub` holds there.
    static void expect_rows_of(const KvStore & c, int64_t n, const KvStore & sub) {
        for (int il = 0; il < c.n_layer(); ++il)
            for (int h = 0; h < c.n_head_kv(); ++h) {
                const auto & all = c.positions(il, h);
                EXPECT_EQ(int64_t(all.size()), n);
                for (int32_t p : sub.positions(il, h))
                    EXPECT_TRUE(std::binary_search(all.begin(), all.end(), p)) << "layer " << il << " head " << h;
            }
    }

    static inline test::TinyModel * tiny_ = nullptr;
    static inline Model * model_ = nullptr;
    static inline std::vector<int32_t> * tokens_ = nullptr;
};

double dot(const float * a, const float * b, int d) {
    double s = 0;
    for (int i = 0; i < d; ++i) s += double(a[i]) * double(b[i]);
    return s;
}

// softmax over keys [0, n) of q . k / sqrt(d), in double
std::vector<double> attn_row(const float * q, const std::vector<float> & k, int64_t n, int d) {
    std::vector<double> p(static_cast<size_t>(n));
    double m = -1e300, sum = 0;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, p[j] = dot(q, k.data() + j * d, d) / std::sqrt(double(d)));
    for (auto & x : p) sum += (x = std::exp(x - m));
    for (auto & x : p) x /= sum;
    return p;
}

// Reference scores per (layer, head) for a scorer, from the keys and all queries.
using RefScores = std::vector<std::vector<std::vector<double>>>;

RefScores reference_scores(const std::string & method, const KvStore & cache, const std::vector<std::vector<float>> & q,
                           const HParams & hp) {
    const int d = hp.head_dim, group = hp.n_gqa(), H = hp.n_head;
    const int64_t L = k_L, w = 32;
    RefScores out(hp.n_layer, std::vector<std::vector<double>>(hp.n_head_kv, std::vector<double>(size_t(L), 0.0)));
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h) {
            const std::vector<float> k = cache.read_k(il, h);
            auto & s = out[il][h];
            auto qrow = [&](int64_t i, int qh) { return q[il].data() + (i * H + qh) * d; };
            if (method == "snapkv") {
                std::vector<double> raw(size_t(L - w), 0.0);
                for (int g = 0; g < group; ++g)
                    for (int64_t i = L - w; i < L; ++i) {
                        const auto p = attn_row(qrow(i, h * group + g), k, i + 1, d);
                        for (int64_t j = 0; j < L - w; ++j) raw[j] += p[j] / group;
                    }
                for (int64_t j = 0; j < L - w; ++j) {  // max-pool, kernel 7, edges over what exists
                    double m = -1e300;
                    for (int64_t t = std::max<int64_t>(0, j - 3); t <= std::min<int64_t>(L - w - 1, j + 3); ++t)
                        m = std::max(m, raw[t]);
                    s[j] = m;
                }
            } else if (method == "h2o") {
                for (int g = 0; g < group; ++g)
                    for (int64_t i = 0; i < L; ++i) {
                        const auto p = attn_row(qrow(i, h * group + g), k, i + 1, d);
                        for (int64_t j = 0; j <= i; ++j) s[j] += p[j] / group;
                    }
            } else if (method == "tova") {  // mean over every head of the layer: filled below
            } else if (method == "knorm") {
                for (int64_t j = 0; j < L; ++j) s[j] = -std::sqrt(dot(k.data() + j * d, k.data() + j * d, d));
            } else if (method == "keydiff") {
                std::vector<double> m(size_t(d), 0.0);
                for (int64_t j = 0; j < L; ++j) {
                    const double n = std::sqrt(dot(k.data() + j * d, k.data() + j * d, d));
                    for (int e = 0; e < d; ++e) m[e] += k[j * d + e] / n / double(L);
                }
                double mn = 0;
                for (double x : m) mn += x * x;
                for (int64_t j = 0; j < L; ++j) {
                    double c = 0;
                    for (int e = 0; e < d; ++e) c += k[j * d + e] * m[e];
                    s[j] = -c / (std::sqrt(dot(k.data() + j * d, k.data() + j * d, d)) * std::sqrt(mn));
                }
            }
        }
    if (method == "tova")
        for (int il = 0; il < hp.n_layer; ++il) {
            std::vector<double> mean(size_t(L), 0.0);
            for (int qh = 0; qh < H; ++qh) {
                const auto p = attn_row(q[il].data() + ((L - 1) * H + qh) * d, cache.read_k(il, qh / group), L, d);
                for (int64_t j = 0; j < L; ++j) mean[j] += p[j] / H;
            }
            for (auto & head : out[il]) head = mean;
        }
    return out;
}

// The reference's kept rows: forced rows plus the top n by reference score. A row where
// the method and the reference disagree must be a tie at the boundary (within k_rel).
void expect_same_rows(const std::vector<int32_t> & got, const std::vector<double> & ref, int64_t n_sink, int64_t window,
                      int64_t budget, const std::string & what) {
    const int64_t L = int64_t(ref.size());
    std::vector<int32_t> cand;
    for (int64_t j = n_sink; j < L - window; ++j) cand.push_back(int32_t(j));
    std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return ref[a] > ref[b]; });
    const int64_t n = std::min<int64_t>(int64_t(cand.size()), budget - n_sink - window);
    std::vector<int32_t> want(cand.begin(), cand.begin() + n);
    for (int64_t j = 0; j < L; ++j)
        if (j < n_sink || j >= L - window) want.push_back(int32_t(j));
    std::sort(want.begin(), want.end());
    ASSERT_EQ(got.size(), want.size()) << what;
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end())) << what;
    if (got == want) return;
    const double threshold = n > 0 ? ref[cand[n - 1]] : 0.0, scale = std::fabs(ref[cand[0]]) + 1e-30;
    std::vector<int32_t> diff;
    std::set_symmetric_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(diff));
    for (int32_t j : diff)
        EXPECT_LE(std::fabs(ref[j] - threshold) / scale, k_rel) << what << ": row " << j << " is not a tie";
}

TEST_F(PressModel, EveryScorerMatchesAPlainReference) {
    const HParams & h = hp();
    const int64_t B = 60;
    struct Case {
        const char * method;
        int64_t n_sink, window;  // forced rows at budget B
    };
    for (const Case c : {Case{"snapkv", 0, 32}, Case{"h2o", 0, B / 2}, Case{"tova", 0, 0}, Case{"knorm", 0, 0},
                         Case{"keydiff", 4, 0}}) {
        const std::string method = c.method;
        const press::Registration * r = press::find_method(method);
        ASSERT_NE(r, nullptr);
        auto scorer = r->scorer(press::Params(method, r->info.params, {}), *model_);
        std::vector<std::vector<float>> q;
        double observe_s = 0;
        KvStore cache = new_cache();
        prefill(cache, scorer->observer(cache, k_L, &observe_s), &q);
        const press::Scores s = scorer->score(cache);
        const RefScores ref = reference_scores(method, cache, q, h);
        for (int il = 0; il < h.n_layer; ++il)
            for (int hh = 0; hh < h.n_head_kv; ++hh) {
                double mx = 0, err = 0;
                for (int64_t j = 0; j < k_L; ++j)
                    if (!s.is_forced(j)) {
                        mx = std::max(mx, std::fabs(ref[il][hh][j]));
                        err = std::max(err, std::fabs(s.s[il][hh][j] - ref[il][hh][j]));
                    }
                EXPECT_LE(err / mx, k_rel) << method << " layer " << il << " head " << hh;
            }
        // the method's plan keeps the reference's top rows plus its forced rows
        auto press = make_press(method, {}, *model_);
        KvStore c2 = new_cache();
        prefill(c2, press->observer(c2, k_L));
        const KeepPlan plan = press->plan(c2, Budget::from_tokens(B));
        for (int il = 0; il < h.n_layer; ++il)
            for (int hh = 0; hh < h.n_head_kv; ++hh)
                expect_same_rows(plan[il][hh], ref[il][hh], c.n_sink, c.window, B,
                                 method + " layer " + std::to_string(il) + " head " + std::to_string(hh));
    }
}

// An observer that asks only for the last rows (the SnapKV window) gets the same queries
// as one that sees every row, whatever graph ran before (ggml's allocator reuses its plan
// for graphs of the same shape: the queries' memory must not be reused).
TEST_F(PressModel, APartialObserverSeesTheSameQueries) {
    const int64_t per_row = int64_t(hp().n_head) * hp().head_dim;
    std::vector<std::vector<float>> seen;
    for (int64_t first : {int64_t(0), k_L - 32, k_L - 1}) {
        std::vector<float> got(size_t(hp().n_layer * k_L * per_row), 0.0f);
        QueryObserver o;
        o.first = first;
        o.on_queries = [&](int il, int64_t tok0, int64_t n, const float * q) {
            ASSERT_GE(tok0, first);
            std::copy(q, q + n * per_row, got.begin() + (il * k_L + tok0) * per_row);
        };
        KvStore c = new_cache();
        Engine(*model_, EngineOptions{k_chunk}).prefill(c, context(), nullptr, nullptr, &o);
        seen.push_back(got);
    }
    for (int il = 0; il < hp().n_layer; ++il)
        for (size_t v = 1; v < seen.size(); ++v) {
            const int64_t first = v == 1 ? k_L - 32 : k_L - 1;
            const auto a = seen[0].begin() + (il * k_L + first) * per_row,
                       b = seen[v].begin() + (il * k_L + first) * per_row;
            EXPECT_TRUE(std::equal(a, a + (k_L - first) * per_row, b)) << "layer " << il << ", first " << first;
        }
}

// ggml's own RoPE (an implementation independent of kvlab's) applied to m vectors [m][d]
// at each of the positions: returns [positions][m][d].
std::vector<float> ggml_rope_at(const HParams & hp, const std::vector<float> & x, int64_t m,
                                const std::vector<int32_t> & positions) {
    const int d = hp.head_dim;
    const int64_t np = int64_t(positions.size());
    ggml_init_params ip = {size_t(3 * np * m * d * sizeof(float)) + np * sizeof(int32_t) + 16 * 1024 * 1024, nullptr,
                           false};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, d, m, np);
    ggml_tensor * pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, np);
    for (int64_t i = 0; i < np; ++i) std::copy(x.begin(), x.end(), static_cast<float *>(t->data) + i * m * d);
    std::copy(positions.begin(), positions.end(), static_cast<int32_t *>(pos->data));
    ggml_tensor * y = ggml_rope_ext(ctx, t, pos, nullptr, hp.n_rot, hp.rope_mode, hp.n_ctx_train, hp.rope_theta,
                                    hp.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    std::vector<float> out(static_cast<const float *>(y->data), static_cast<const float *>(y->data) + np * m * d);
    ggml_free(ctx);
    return out;
}

TEST_F(PressModel, ExpectedAttentionMatchesAReferenceBuiltOnGgmlRope) {
    const HParams & h = hp();
    const int d = h.head_dim, H = h.n_head, group = h.n_gqa();
    const int64_t n_sink = 4, n_future = 512;
    const press::Registration * r = press::find_method("expected_attention");
    auto scorer = r->scorer(press::Params("expected_attention", r->info.params, {}), *model_);
    std::vector<std::vector<float>> q;
    double observe_s = 0;
    KvStore cache = new_cache();
    prefill(cache, scorer->observer(cache, k_L, &observe_s), &q);
    const press::Scores s = scorer->score(cache);
    std::vector<int32_t> future(n_future);
    std::iota(future.begin(), future.end(), int32_t(k_L));
    for (int il = 0; il < h.n_layer; ++il) {
        // pre-RoPE queries: ggml's rotation by -position of each observed query
        std::vector<std::vector<double>> mu(H, std::vector<double>(d, 0.0)), cov(H, std::vector<double>(d * d, 0.0));
        for (int64_t i = n_sink; i < k_L; ++i) {
            std::vector<float> qi(q[il].begin() + i * H * d, q[il].begin() + (i + 1) * H * d);
            const auto pre = ggml_rope_at(h, qi, H, {-int32_t(i)});
            for (int qh = 0; qh < H; ++qh)
                for (int e = 0; e < d; ++e) {
                    mu[qh][e] += pre[qh * d + e];
                    for (int f = 0; f < d; ++f) cov[qh][e * d + f] += double(pre[qh * d + e]) * pre[qh * d + f];
                }
        }
        const double n = double(k_L - n_sink);
        for (int qh = 0; qh < H; ++qh) {
            for (auto & x : mu[qh]) x /= n;
            for (int e = 0; e < d; ++e)
                for (int f = 0; f < d; ++f) cov[qh][e * d + f] = cov[qh][e * d + f] / n - mu[qh][e] * mu[qh][f];
        }
        // the rotation averaged over the next n_future positions, applied as the mean of
        // ggml's rotations: mu' = Rbar mu, Sigma' = Rbar Sigma Rbar^T (columns, then rows)
        auto avg_rotate = [&](const std::vector<std::vector<double>> & vecs) {
            std::vector<float> flat;
            for (const auto & v : vecs) flat.insert(flat.end(), v.begin(), v.end());
            const int64_t m = int64_t(vecs.size());
            const auto rot = ggml_rope_at(h, flat, m, future);
            std::vector<std::vector<double>> out(m, std::vector<double>(d, 0.0));
            for (int64_t t = 0; t < n_future; ++t)
                for (int64_t v = 0; v < m; ++v)
                    for (int e = 0; e < d; ++e) out[v][e] += rot[(t * m + v) * d + e] / double(n_future);
            return out;
        };
        for (int hh = 0; hh < h.n_head_kv; ++hh) {
            const std::vector<float> k = cache.read_k(il, hh), v = cache.read_v(il, hh);
            std::vector<double> ref(size_t(k_L), 0.0);
            for (int g = 0; g < group; ++g) {
                const int qh = hh * group + g;
                const auto m2 = avg_rotate({mu[qh]})[0];
                std::vector<std::vector<double>> cols(d, std::vector<double>(d));
                for (int c = 0; c < d; ++c)
                    for (int e = 0; e < d; ++e) cols[c][e] = cov[qh][e * d + c];
                const auto rc = avg_rotate(cols);  // rc[c] = (Rbar Sigma)[:, c]
                std::vector<std::vector<double>> rows(d, std::vector<double>(d));
                for (int e = 0; e < d; ++e)
                    for (int c = 0; c < d; ++c) rows[e][c] = rc[c][e];
                const auto sig = avg_rotate(rows);  // sig[e] = row e of Rbar Sigma Rbar^T
                // the softmax over the keys after the sinks (kvpress drops the sinks first)
                std::vector<double> logit(static_cast<size_t>(k_L), 0.0);
                double mx = -1e300, sum = 0;
                for (int64_t j = n_sink; j < k_L; ++j) {
                    double a = 0, b = 0;
                    for (int e = 0; e < d; ++e) {
                        a += m2[e] * k[j * d + e];
                        for (int f = 0; f < d; ++f) b += k[j * d + e] * sig[e][f] * k[j * d + f];
                    }
                    logit[j] = a / std::sqrt(double(d)) + b / (2.0 * d);
                    mx = std::max(mx, logit[j]);
                }
                for (int64_t j = n_sink; j < k_L; ++j) sum += (logit[j] = std::exp(logit[j] - mx));
                for (int64_t j = n_sink; j < k_L; ++j) ref[j] += logit[j] / sum / group;
            }
            double mx = 0, err = 0;
            for (int64_t j = 0; j < k_L; ++j) {
                ref[j] *= std::sqrt(dot(v.data() + j * d, v.data() + j * d, d));
                if (s.is_forced(j)) continue;
                mx = std::max(mx, std::fabs(ref[j]));
                err = std::max(err, std::fabs(s.s[il][hh][j] - ref[j]));
            }
            EXPECT_LE(err / mx, k_rel) << "layer " << il << " head " << hh;
        }
    }
}

TEST_F(PressModel, RatioZeroAndLargeBudgetsKeepTheFullCacheLogits) {
    Engine e(*model_);
    KvStore full = new_cache();
    prefill(full, nullptr);
    KvStore f2 = full.copy();
    const auto want = e.prefill(f2, query());
    const std::string dir = test::temp_dir("press-model-methods");
    for (const MethodInfo & m : press_methods())
        for (const Budget b : {Budget::from_ratio(0.0), Budget::from_tokens(k_L), Budget::from_tokens(k_L + 100)}) {
            KvStore c = compressed(m.name, b, test::method_test_params(m.name, *model_, dir));
            EXPECT_EQ(c.total_rows(), full.total_rows()) << m.name << " " << b.describe();
            EXPECT_EQ(e.prefill(c, query()), want) << m.name << " " << b.describe();  // bit-identical
        }
    std::filesystem::remove_all(dir);
}

TEST_F(PressModel, StreamingLlmKeepsSinksAndTheMostRecent) {
    const int64_t B = 40;
    KvStore c = compressed("streaming_llm", Budget::from_tokens(B));
    std::vector<int32_t> want = {0, 1, 2, 3};
    for (int64_t j = k_L - (B - 4); j < k_L; ++j) want.push_back(int32_t(j));
    for (int il = 0; il < c.n_layer(); ++il)
        for (int h = 0; h < c.n_head_kv(); ++h) EXPECT_EQ(c.positions(il, h), want);
    // a ratio: kept = int(L * (1 - r)), kvpress's rounding (here 45 rows under either rule; see
    // PressScoring.RatioKeepsWhatKvpressKeeps for the cases where the two rules differ)
    KvStore r = compressed("streaming_llm", Budget::from_ratio(0.7));
    EXPECT_EQ(r.n_rows(1, 1), int64_t(double(k_L) * (1.0 - 0.7)));
}

TEST_F(PressModel, TovaKeepLastKeepsTheLastContextToken) {
    // at 10 rows the last token's own attention rarely ranks it; keep_last (kvpress's rule) must
    KvStore kept = compressed("tova", Budget::from_tokens(10), {{"keep_last", "true"}});
    for (int il = 0; il < kept.n_layer(); ++il)
        for (int h = 0; h < kept.n_head_kv(); ++h) {
            EXPECT_EQ(kept.n_rows(il, h), 10);
            EXPECT_EQ(kept.positions(il, h).back(), int32_t(k_L - 1)) << "layer " << il;
        }
    // without the rule some layer drops it on this model: the check above is not void
    KvStore plain = compressed("tova", Budget::from_tokens(10));
    int dropped = 0;
    for (int il = 0; il < plain.n_layer(); ++il) dropped += plain.positions(il, 0).back() != int32_t(k_L - 1);
    EXPECT_GT(dropped, 0);
}

TEST_F(PressModel, PyramidBudgetsFollowTheFormula) {
    // L = 150, B = 60, w = 8, N = 3, beta = 20: b = 52, min = 2, max = 102 (< L - w),
    // step = (102 - 2) / 2 = 50: layers keep 110, 60 and 10 rows.
    KvStore c = compressed("pyramidkv", Budget::from_tokens(60), {{"window", "8"}});
    EXPECT_EQ(c.n_rows(0, 0), 110);
    EXPECT_EQ(c.n_rows(1, 1), 60);
    EXPECT_EQ(c.n_rows(2, 0), 10);
    // L < 2b: uniform SnapKV
    KvStore u = compressed("pyramidkv", Budget::from_tokens(100), {{"window", "8"}});
    for (int il = 0; il < 3; ++il) EXPECT_EQ(u.n_rows(il, 0), 100);
}

TEST_F(PressModel, AdaKvBudgetsSumToTheTotalAndHonourTheSafeguard) {
    const int64_t B = 50, w = 32;
    for (const char * base : {"snapkv", "knorm"}) {
        KvStore c = compressed("adakv", Budget::from_tokens(B), {{"base", base}, {"alpha", "0.5"}});
        const int64_t forced = std::string(base) == "snapkv" ? w : 0;
        bool differ = false;
        for (int il = 0; il < c.n_layer(); ++il) {
            int64_t sum = 0;
            for (int h = 0; h < c.n_head_kv(); ++h) {
                const int64_t n = c.n_rows(il, h) - forced;
                EXPECT_GE(n, int64_t(std::floor(0.5 * double(B - forced)))) << base << " layer " << il;
                sum += n;
                differ = differ || c.n_rows(il, h) != c.n_rows(il, 0);
            }
            EXPECT_EQ(sum, c.n_head_kv() * (B - forced)) << base << " layer " << il;
        }
        EXPECT_TRUE(differ) << base << ": the heads should get different budgets on this model";
    }
}

TEST_F(PressModel, BatchedQueryOnAnyCacheShapeEqualsOneTokenAtATime) {
    for (const char * method : {"pyramidkv", "adakv", "snapkv"}) {
        KvStore c = compressed(method, Budget::from_tokens(64), {{"window", "8"}});
        EXPECT_FALSE(c.uniform()) << method;
        Engine batched(*model_, EngineOptions{512}), single(*model_, EngineOptions{1});
        KvStore a = c.copy(), b = c.copy();
        std::vector<float> la, lb;
        batched.prefill(a, query(), nullptr, &la);
        single.prefill(b, query(), nullptr, &lb);
        const auto d = test::compare_logits(la, lb, hp().n_vocab);
        EXPECT_EQ(d.max_abs, 0.0f) << method;  // kvlab's kernel: bit-identical
        EXPECT_EQ(a.next_pos(), k_L + int32_t(query().size()));
        EXPECT_EQ(a.positions(0, 0).back(), a.next_pos() - 1);  // new rows at original positions
    }
}

// The stated bound: after compaction the store allocates at most the kept rows plus the
// reserve, plus 5% (alignment of the backend buffer).
TEST_F(PressModel, CompactionFreesMemoryWithinTheBound) {
    const int64_t reserve = 16;
    for (const char * method : {"snapkv", "adakv", "pyramidkv", "streaming_llm"})
        for (double ratio : {0.5, 0.9}) {
            const ParamMap params = std::string(method) == "streaming_llm" ? ParamMap{} : ParamMap{{"window", "8"}};
            auto press = make_press(method, params, *model_);
            KvStore c = new_cache();
            prefill(c, press->observer(c, k_L));
            const CompressStats st = compress(*press, c, Budget::from_ratio(ratio), reserve);
            const uint64_t reserve_bytes = uint64_t(c.n_layer()) * c.n_head_kv() * reserve * c.row_bytes();
            EXPECT_EQ(st.used_after, uint64_t(c.total_rows()) * c.row_bytes());
            EXPECT_LE(double(st.bytes_after), 1.05 * double(st.used_after + reserve_bytes)) << method << " " << ratio;
            EXPECT_LT(double(st.bytes_after), (1.0 - ratio) * double(st.bytes_before) + double(reserve_bytes) * 1.05 +
                                                  double(c.n_layer() * c.n_head_kv() * 8 * c.row_bytes()))
                << method << " " << ratio;
            // growth past the reserve: a long answer still works, at the original positions
            Engine e(*model_);
            GenerateOptions go;
            go.max_tokens = 3 * int32_t(reserve);
            go.stop_on_eog = false;
            const int64_t before = c.n_rows(0, 0);
            const GenerateResult r = e.generate(c, query(), go);
            EXPECT_EQ(c.n_rows(0, 0), before + int64_t(query().size()) + r.n_decoded);
            EXPECT_EQ(c.next_pos(), k_L + int32_t(query().size()) + int32_t(r.n_decoded));
        }
}

TEST_F(PressModel, WrappersAndRandomFollowTheirRules) {
    const int64_t B = 72, w = 32;
    // random: reproducible for a seed, different for another
    EXPECT_EQ(compressed("random", Budget::from_tokens(B)).positions(1, 0),
              compressed("random", Budget::from_tokens(B)).positions(1, 0));
    EXPECT_NE(compressed("random", Budget::from_tokens(B), {{"seed", "1"}}).positions(1, 0),
              compressed("random", Budget::from_tokens(B)).positions(1, 0));
    // chunkkv: the same rows for every head; the candidates kept come in whole chunks of 20
    // (one chunk per layer may be cut), and the window is kept
    KvStore c = compressed("chunkkv", Budget::from_tokens(B));
    for (int il = 0; il < c.n_layer(); ++il) {
        EXPECT_EQ(c.positions(il, 0), c.positions(il, 1));
        ASSERT_EQ(c.n_rows(il, 0), B);
        std::vector<int> per_chunk((k_L - w + 19) / 20, 0);
        for (int32_t p : c.positions(il, 0))
            if (p < k_L - w) ++per_chunk[p / 20];
        int cut = 0;
        for (size_t i = 0; i < per_chunk.size(); ++i) {
            const int size = std::min<int>(20, int(k_L - w) - int(i) * 20);
            cut += per_chunk[i] != 0 && per_chunk[i] != size;
        }
        EXPECT_LE(cut, 1) << "layer " << il;
        EXPECT_EQ(c.positions(il, 0).back(), k_L - 1);
    }
    // criticalkv: keeps the top half of the candidate budget by the base (snapkv) score
    KvStore snap = compressed("snapkv", Budget::from_tokens(w + (B - w) / 2));
    expect_rows_of(compressed("criticalkv", Budget::from_tokens(B)), B, snap);
}

// The kvpress rules behind --preset kvpress (docs/methods.md, "Fidelity to kvpress").
TEST_F(PressModel, KvpressRulesOfTheWrappers) {
    const int64_t w = 32;
    // chunkkv, chunking=kvpress: max(1, int(n_chunks keep)) whole chunks of 20 over all rows
    // (the window's chunks first), the same for every head
    const double keep = 0.5;
    KvStore c = compressed("chunkkv", Budget::from_ratio(1.0 - keep), {{"chunking", "kvpress"}});
    const int64_t n_chunks = (k_L + 19) / 20, n_kept = int64_t(double(n_chunks) * keep);
    for (int il = 0; il < c.n_layer(); ++il) {
        EXPECT_EQ(c.positions(il, 0), c.positions(il, 1));
        std::vector<int> per_chunk(size_t(n_chunks), 0);
        for (int32_t p : c.positions(il, 0)) ++per_chunk[p / 20];
        int whole = 0;
        for (int64_t i = 0; i < n_chunks; ++i) {
            const int size = int(std::min<int64_t>(20, k_L - i * 20));
            EXPECT_TRUE(per_chunk[i] == 0 || per_chunk[i] == size) << "layer " << il << " chunk " << i;
            whole += per_chunk[i] == size;
        }
        EXPECT_EQ(whole, n_kept) << "layer " << il;
        for (int64_t j = k_L - w; j < k_L; ++j) EXPECT_GT(per_chunk[j / 20], 0) << "window row " << j;
    }
    // criticalkv, stages=kvpress: stage 1 is int(0.5 B) rows counting the window, so the top
    // int(0.5 B) - w candidates by the base score are kept
    const int64_t B = 96;
    KvStore snap = compressed("snapkv", Budget::from_tokens(B / 2));
    KvStore crit = compressed("criticalkv", Budget::from_tokens(B), {{"stages", "kvpress"}});
    KvStore own = compressed("criticalkv", Budget::from_tokens(B));
    expect_rows_of(crit, B, snap);
    bool differs = false;
    for (int il = 0; il < crit.n_layer(); ++il)
        for (int h = 0; h < crit.n_head_kv(); ++h) differs = differs || crit.positions(il, h) != own.positions(il, h);
    EXPECT_TRUE(differs) << "the kvpress stages kept the rows of kvlab's own";
    // adakv, allocation=kvpress: every layer keeps H * B rows, each head at least max(1, int(0.2 B))
    KvStore ada = compressed("adakv", Budget::from_tokens(B), {{"allocation", "kvpress"}});
    for (int il = 0; il < ada.n_layer(); ++il) {
        int64_t total = 0;
        for (int h = 0; h < ada.n_head_kv(); ++h) {
            total += ada.n_rows(il, h);
            EXPECT_GE(ada.n_rows(il, h), std::max<int64_t>(w, int64_t(0.2 * double(B))));
        }
        EXPECT_EQ(total, B * ada.n_head_kv()) << "layer " << il;
    }
}

TEST_F(PressModel, BadInputIsRefused) {
    auto expect_error = [](const std::function<void()> & f, const std::string & fragment) {
        try {
            f();
            ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
        } catch (const Error & e) {
            EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        }
    };
    expect_error([] { make_press("snapkvv", {}, *model_); }, "unknown method 'snapkvv'");
    expect_error([] { make_press("snapkv", {{"windw", "8"}}, *model_); }, "unknown parameter 'windw'");
    expect_error([] { make_press("snapkv", {{"window", "eight"}}, *model_); }, "must be an integer");
    expect_error([] { make_press("adakv", {{"base", "adakv"}}, *model_); }, "is not a scorer method");
    expect_error([] { Budget::from_ratio(1.0); }, "[0, 1)");
    expect_error([] { Budget::from_ratio(-0.1); }, "[0, 1)");
    expect_error([] { compressed("snapkv", Budget::from_tokens(20)); }, "smaller than the 0 sink and 32 window");
    expect_error([] { compressed("streaming_llm", Budget::from_tokens(3)); }, "smaller than the 4 sink");
}

}  // namespace
}  // namespace kvlab
