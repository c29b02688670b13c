// KVzip on a tiny random-weight model: the rows it keeps are the top rows of a plain double
// reference that rebuilds every repeat pass from the specification (docs/methods.md), captures
// its queries and keys and recomputes the restricted softmax; budgets add up (global and
// layerwise); ratio 0 gives bit-identical logits; no repeat row survives the scoring passes.
#include <gtest/gtest.h>

#include <cmath>

#include "ggml-backend.h"
#include "kvlab/error.h"
#include "kvlab/session.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int64_t k_L = 150, k_chunk = 60, k_sink = 4;

class Kvzip : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 3;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.seed = 21;
        spec.n_ctx_train = 512;
        tiny_ = test::load_tiny_model(spec, "kvzip", k_L + 6).release();
        tok_ = new Tokenizer(tiny_->model->path());
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete tiny_;
    }
    static const Model & model() { return *tiny_->model; }
    static std::vector<int32_t> context() { return {tiny_->tokens.begin(), tiny_->tokens.begin() + k_L}; }
    static std::vector<int32_t> query() { return {tiny_->tokens.begin() + k_L, tiny_->tokens.end()}; }
    static MethodRequest kvzip(bool layerwise, bool plus = false) {
        return {"kvzip",
                {{"chunk", std::to_string(k_chunk)},
                 {"layerwise", layerwise ? "true" : "false"},
                 {"plus", plus ? "true" : "false"}}};
    }

    // The reference: score[il][h][j] = max over the repeat queries and the group of the
    // restricted softmax, in double, for j in [k_sink, L). KVzip+ (plus): each probability of
    // query row r and query head qh times ||W_o,qh v_j|| / ||x_r|| (x_r: the hidden state entering
    // the attention at r, as the engine hands it over; W_o read from the model, the product in double).
    static std::vector<std::vector<std::vector<double>>> reference_scores(Engine & engine, const KvStore & prefilled,
                                                                          bool plus = false) {
        const HParams & hp = model().hparams();
        const std::vector<int32_t> ctx = context();
        const int d = hp.head_dim, group = hp.n_gqa();
        std::vector<std::vector<std::vector<double>>> best(
            hp.n_layer, std::vector<std::vector<double>>(hp.n_head_kv, std::vector<double>(k_L, 0.0)));
        const std::vector<int32_t> suffix = tok_->user_turn_suffix();
        for (int64_t c0 = k_sink; c0 < k_L; c0 += k_chunk) {
            const int64_t c1 = std::min(k_L, c0 + k_chunk);
            std::vector<int32_t> pass =
                tok_->encode(c0 == k_sink ? "\n\nRepeat the previous context exactly."
                                          : "\n\nRepeat the part of the previous context exactly, starting with",
                             false, true);
            if (c0 > k_sink) pass.insert(pass.end(), ctx.begin() + (c0 - 8), ctx.begin() + c0);
            pass.insert(pass.end(), suffix.begin(), suffix.end());
            pass.insert(pass.end(), ctx.begin() + c0, ctx.begin() + c1);
            const int64_t m = int64_t(pass.size());
            std::vector<std::vector<float>> q(hp.n_layer);  // [layer][m][n_head][d]
            std::vector<std::vector<double>> x_norm(hp.n_layer, std::vector<double>(size_t(m)));  // [layer][m]
            QueryObserver obs;
            if (plus)
                obs.on_hidden = [&](int il, int64_t tok0, int64_t n, const float * x) {
                    for (int64_t r = 0; r < n; ++r) {
                        double ss = 0.0;
                        for (int e = 0; e < hp.n_embd; ++e) ss += double(x[r * hp.n_embd + e]) * x[r * hp.n_embd + e];
                        x_norm[il][size_t(tok0 + r)] = std::sqrt(ss);
                    }
                };
            obs.on_queries = [&](int il, int64_t tok0, int64_t n, const float * qs) {
                q[il].resize(size_t(m) * hp.n_head * d);
                std::copy(qs, qs + n * hp.n_head * d, q[il].begin() + tok0 * hp.n_head * d);
            };
            KvStore work = prefilled.copy();
            engine.prefill(work, pass, nullptr, nullptr, &obs);
            for (int il = 0; il < hp.n_layer; ++il) {
                const ggml_tensor * wo = model().attn_output(il);  // F32 [n_head * d][n_embd]
                std::vector<float> w(size_t(ggml_nelements(wo)));
                ggml_backend_tensor_get(const_cast<ggml_tensor *>(wo), w.data(), 0, ggml_nbytes(wo));
                for (int h = 0; h < hp.n_head_kv; ++h) {
                    const std::vector<float> k = work.read_k(il, h);  // [L + m][d]
                    const std::vector<float> v = work.read_v(il, h);
                    // ||W_o,qh v_j|| of the chunk's rows for each query head of the group
                    std::vector<std::vector<double>> vnorm(group, std::vector<double>(k_L, 1.0));
                    if (plus)
                        for (int g = 0; g < group; ++g)
                            for (int64_t j = c0; j < c1; ++j) {
                                double ss = 0.0;
                                for (int e = 0; e < hp.n_embd; ++e) {
                                    double o = 0.0;
                                    for (int i = 0; i < d; ++i)
                                        o += double(w[size_t(e) * hp.n_head * d + (h * group + g) * d + i]) *
                                             v[size_t(j) * d + i];
                                    ss += o * o;
                                }
                                vnorm[g][size_t(j)] = std::sqrt(ss);
                            }
                    for (int64_t r = 0; r < m; ++r)
                        for (int g = 0; g < group; ++g) {
                            const float * qr = q[il].data() + (r * hp.n_head + h * group + g) * d;
                            std::vector<int64_t> keys;
                            for (int64_t j = 0; j < k_sink; ++j) keys.push_back(j);
                            for (int64_t j = c0; j < c1; ++j) keys.push_back(j);
                            for (int64_t j = 0; j <= r; ++j) keys.push_back(k_L + j);
                            std::vector<double> logit(keys.size());
                            double mx = -1e300, sum = 0.0;
                            for (size_t x = 0; x < keys.size(); ++x) {
                                double dot = 0.0;
                                for (int i = 0; i < d; ++i) dot += double(qr[i]) * double(k[keys[x] * d + i]);
                                logit[x] = dot / std::sqrt(double(d));
                                mx = std::max(mx, logit[x]);
                            }
                            for (double & v : logit) sum += (v = std::exp(v - mx));
                            const double row = plus ? 1.0 / x_norm[il][size_t(r)] : 1.0;
                            for (int64_t x = k_sink; x < k_sink + (c1 - c0); ++x)
                                best[il][h][keys[x]] =
                                    std::max(best[il][h][keys[x]], logit[x] / sum * row * vnorm[g][size_t(keys[x])]);
                        }
                }
            }
        }
        return best;
    }

    static inline test::TinyModel * tiny_ = nullptr;
    static inline Tokenizer * tok_ = nullptr;
};

TEST_F(Kvzip, KeepsTheTopRowsOfAPlainDoubleReference) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    ContextSession s(engine, {kvzip(false), kvzip(true)}, SessionOptions{0, 0, tok_});
    s.prefill(context());
    const auto ref = reference_scores(engine, s.prefilled());
    for (size_t m = 0; m < 2; ++m) {
        const bool layerwise = m == 1;
        const PreparedCache p = s.compress(m, Budget::from_ratio(0.6));
        const int64_t B = Budget::from_ratio(0.6).per_layer(k_L);
        ASSERT_EQ(p.cache.total_rows(), B * hp.n_layer * hp.n_head_kv) << "budgets add up";
        std::vector<int64_t> per_layer;
        double kept_min = 1e300, dropped_max = -1e300;
        for (int il = 0; il < hp.n_layer; ++il) {
            int64_t layer_rows = 0;
            for (int h = 0; h < hp.n_head_kv; ++h) {
                const auto & pos = p.cache.positions(il, h);
                layer_rows += int64_t(pos.size());
                for (int64_t j = 0; j < k_sink; ++j) EXPECT_EQ(pos[j], j) << "sinks kept";
                std::vector<bool> kept(k_L, false);
                for (int32_t x : pos) kept[x] = true;
                for (int64_t j = k_sink; j < k_L; ++j)
                    (kept[j] ? kept_min : dropped_max) =
                        kept[j] ? std::min(kept_min, ref[il][h][j]) : std::max(dropped_max, ref[il][h][j]);
            }
            per_layer.push_back(layer_rows);
            if (layerwise) {  // the threshold is per layer: compare within the layer
                EXPECT_EQ(layer_rows, B * hp.n_head_kv) << "layer " << il;
                EXPECT_GE(kept_min, dropped_max - 1e-5) << "layer " << il;
                kept_min = 1e300;
                dropped_max = -1e300;
            }
        }
        if (!layerwise) {
            EXPECT_GE(kept_min, dropped_max - 1e-5) << "one global threshold";
            EXPECT_NE(*std::min_element(per_layer.begin(), per_layer.end()),
                      *std::max_element(per_layer.begin(), per_layer.end()))
                << "layers keep different counts";
        }
    }
}

TEST_F(Kvzip, PlusKeepsTheTopRowsOfItsDoubleReference) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    ContextSession s(engine, {kvzip(false, true), kvzip(false)}, SessionOptions{0, 0, tok_});
    s.prefill(context());
    const auto ref = reference_scores(engine, s.prefilled(), true);
    const PreparedCache p = s.compress(0, Budget::from_ratio(0.6)), plain = s.compress(1, Budget::from_ratio(0.6));
    ASSERT_EQ(p.cache.total_rows(), Budget::from_ratio(0.6).per_layer(k_L) * hp.n_layer * hp.n_head_kv);
    double kept_min = 1e300, dropped_max = -1e300;
    bool differs = false;
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h) {
            differs = differs || p.cache.positions(il, h) != plain.cache.positions(il, h);
            std::vector<bool> kept(k_L, false);
            for (int32_t x : p.cache.positions(il, h)) kept[x] = true;
            for (int64_t j = k_sink; j < k_L; ++j)
                (kept[j] ? kept_min : dropped_max) =
                    kept[j] ? std::min(kept_min, ref[il][h][j]) : std::max(dropped_max, ref[il][h][j]);
        }
    // float against double: a relative margin (the scores are KVzip's divided by ||x|| ~ 8)
    EXPECT_GE(kept_min, dropped_max * (1.0 - 1e-4));
    EXPECT_GT(kept_min, 0.0);
    EXPECT_TRUE(differs) << "the normalisation changes the choice";
}

TEST_F(Kvzip, NoRepeatRowSurvivesAndRatioZeroIsBitIdentical) {
    Engine engine(model());
    const SessionOptions so{int64_t(query().size()), 0, tok_};
    ContextSession with(engine, {kvzip(false)}, so), without(engine, {}, so);
    with.prefill(context());
    without.prefill(context());
    const KvStore & base = with.prefilled();
    EXPECT_EQ(base.next_pos(), k_L);
    for (int il = 0; il < base.n_layer(); ++il)
        for (int h = 0; h < base.n_head_kv(); ++h) {
            ASSERT_EQ(base.n_rows(il, h), k_L);
            EXPECT_EQ(base.read_k(il, h), without.prefilled().read_k(il, h));
        }
    EXPECT_GT(with.observe_seconds(0), 0.0) << "the scoring passes count as the method's time";
    const std::vector<int32_t> answer = {7, 8, 9};
    const PreparedCache all = with.compress(0, Budget::from_ratio(0.0));
    EXPECT_EQ(all.cache.total_rows(), without.full().cache.total_rows());
    EXPECT_EQ(with.teacher_forced(all.cache, query(), answer),
              without.teacher_forced(without.full().cache, query(), answer));
}

TEST_F(Kvzip, NeedsTheTokenizerAndASinkBudget) {
    Engine engine(model());
    EXPECT_THROW(ContextSession(engine, {kvzip(false)}, SessionOptions{0, 0}), Error);
    ContextSession s(engine, {kvzip(false)}, SessionOptions{0, 0, tok_});
    s.prefill(context());
    EXPECT_THROW(s.compress(0, Budget::from_tokens(2)), Error);
    // the chat template closes the user turn with the suffix the passes use
    const std::vector<int32_t> chat = tok_->chat({{"user", "hello"}}), suffix = tok_->user_turn_suffix();
    ASSERT_FALSE(suffix.empty());
    EXPECT_TRUE(std::equal(suffix.begin(), suffix.end(), chat.end() - long(suffix.size())));
}

}  // namespace
}  // namespace kvlab
