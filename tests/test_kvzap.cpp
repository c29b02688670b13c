// KVzap (docs/methods.md "KVzap"): the ridge fit against a plain normal-equation solve; the
// scorer file's round trip and its refusals; the hidden states the engine hands over against
// the GGUF's own weights; kvzap keeps the top rows of a double recomputation of its surrogate,
// and in threshold mode exactly the rows at or above the threshold plus the sinks and the window; training
// on a tiny model runs end to end, for the linear surrogate and the MLP.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "ggml-cpp.h"
#include "gguf.h"
#include "kvlab/error.h"
#include "kvlab/scorer_training.h"
#include "kvlab/session.h"
#include "kvlab/surrogate.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

std::vector<float> randn(size_t n, std::mt19937_64 & rng, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float & x : v) x = d(rng);
    return v;
}

// Solves M z = r (n x n, dense, double) by Gaussian elimination with partial pivoting.
std::vector<double> solve_plain(std::vector<std::vector<double>> M, std::vector<double> r) {
    const size_t n = r.size();
    for (size_t c = 0; c < n; ++c) {
        size_t p = c;
        for (size_t i = c + 1; i < n; ++i)
            if (std::fabs(M[i][c]) > std::fabs(M[p][c])) p = i;
        std::swap(M[c], M[p]);
        std::swap(r[c], r[p]);
        for (size_t i = c + 1; i < n; ++i) {
            const double f = M[i][c] / M[c][c];
            for (size_t k = c; k < n; ++k) M[i][k] -= f * M[c][k];
            r[i] -= f * r[c];
        }
    }
    std::vector<double> z(n);
    for (size_t i = n; i-- > 0;) {
        double s = r[i];
        for (size_t k = i + 1; k < n; ++k) s -= M[i][k] * z[k];
        z[i] = s / M[i][i];
    }
    return z;
}

TEST(RidgeFit, MatchesAPlainNormalEquationSolve) {
    constexpr int n_in = 7, n_out = 3, m = 240;
    constexpr double alpha = 0.5;
    std::mt19937_64 rng(5);
    std::vector<float> x = randn(size_t(m) * n_in, rng, 2.0f), y = randn(size_t(m) * n_out, rng);
    for (int i = 0; i < m; ++i) x[size_t(i) * n_in] += 3.0f;  // a feature far from zero mean
    RidgeFit fit(n_in, n_out);
    fit.add(x.data(), y.data(), 100);  // streamed in two parts
    fit.add(x.data() + 100 * n_in, y.data() + 100 * n_out, m - 100);
    EXPECT_EQ(fit.n(), m);
    std::vector<float> w, b;
    fit.solve(alpha, w, b);
    // the reference: [X 1] z = y in the least-squares sense, the intercept unpenalised
    for (int o = 0; o < n_out; ++o) {
        std::vector<std::vector<double>> M(n_in + 1, std::vector<double>(n_in + 1, 0.0));
        std::vector<double> r(n_in + 1, 0.0);
        for (int i = 0; i < m; ++i) {
            std::vector<double> a(n_in + 1, 1.0);
            for (int k = 0; k < n_in; ++k) a[k] = x[size_t(i) * n_in + k];
            for (int p = 0; p <= n_in; ++p) {
                for (int q = 0; q <= n_in; ++q) M[p][q] += a[p] * a[q];
                r[p] += a[p] * y[size_t(i) * n_out + o];
            }
        }
        for (int k = 0; k < n_in; ++k) M[k][k] += alpha;
        const std::vector<double> z = solve_plain(M, r);
        for (int k = 0; k < n_in; ++k) EXPECT_NEAR(w[size_t(o) * n_in + k], z[k], 1e-5) << "output " << o << " w" << k;
        EXPECT_NEAR(b[o], z[n_in], 1e-5) << "output " << o << " intercept";
    }
    RidgeFit one(n_in, n_out);
    one.add(x.data(), y.data(), 1);
    EXPECT_THROW(one.solve(alpha, w, b), Error);
}

TEST(Spearman, RanksWithTies) {
    EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {10, 20, 30, 45}), 1.0);
    EXPECT_DOUBLE_EQ(spearman({1, 2, 3, 4}, {4, 3, 2, 1}), -1.0);
    EXPECT_NEAR(spearman({1, 1, 2}, {1, 2, 3}), std::sqrt(3.0) / 2.0, 1e-12);  // ranks 0.5 0.5 2 vs 0 1 2
    EXPECT_EQ(spearman({1, 1, 1}, {1, 2, 3}), 0.0);
}

Surrogate random_surrogate(Surrogate::Kind kind, int n_layer, int n_in, int n_out, int n_hidden, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<Surrogate::Layer> layers(static_cast<size_t>(n_layer));
    const int rows = kind == Surrogate::Kind::linear ? n_out : n_hidden;
    for (auto & l : layers) {
        l.w1 = randn(size_t(rows) * n_in, rng, 0.3f);
        l.b1 = randn(size_t(rows), rng, 0.5f);
        if (kind == Surrogate::Kind::mlp) {
            l.w2 = randn(size_t(n_out) * n_hidden, rng, 0.3f);
            l.b2 = randn(size_t(n_out), rng, 0.5f);
        }
    }
    return Surrogate(kind, n_in, n_out, kind == Surrogate::Kind::linear ? 0 : n_hidden, std::move(layers));
}

std::string file_bytes(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string & path, const std::string & b) {
    std::ofstream(path, std::ios::binary) << b;
}

// The error's message contains `what`.
template <typename F>
void expect_error(F f, const std::string & what) {
    try {
        f();
        ADD_FAILURE() << "no error; expected one saying '" << what << "'";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
}

TEST(SurrogateFile, RoundTripAndRefusals) {
    const std::string dir = test::temp_dir("surrogate");
    for (const Surrogate::Kind kind : {Surrogate::Kind::linear, Surrogate::Kind::mlp}) {
        Surrogate s = random_surrogate(kind, 3, 10, 2, 6, 9);
        s.model = {{"name", "m.gguf"}, {"sha256", std::string(64, 'a')}, {"arch", "llama"}};
        s.training = {{"seed", 3}};
        s.fit = {{"mean_r2", 0.5}};
        const std::string path = dir + "/nested/" + Surrogate::kind_name(kind) + ".kvzap";
        s.save(path);
        EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir + "/nested"), {}),
                  kind == Surrogate::Kind::linear ? 1 : 2)
            << "no temporary file left behind";
        const Surrogate r = Surrogate::load(path, std::string(64, 'a'));
        ASSERT_EQ(r.kind(), kind);
        ASSERT_EQ(r.n_layer(), 3);
        EXPECT_EQ(r.training, s.training);
        EXPECT_EQ(r.fit, s.fit);
        for (int il = 0; il < 3; ++il) {
            EXPECT_EQ(r.layer(il).w1, s.layer(il).w1);
            EXPECT_EQ(r.layer(il).b2, s.layer(il).b2);
        }
        // predictions against a plain double evaluation
        std::mt19937_64 rng(2);
        const std::vector<float> x = randn(4 * 10, rng);
        std::vector<float> y(4 * 2);
        r.predict(1, x.data(), 4, y.data());
        const Surrogate::Layer & l = s.layer(1);
        for (int i = 0; i < 4; ++i)
            for (int o = 0; o < 2; ++o) {
                double v;
                if (kind == Surrogate::Kind::linear) {
                    v = l.b1[o];
                    for (int k = 0; k < 10; ++k) v += double(l.w1[size_t(o) * 10 + k]) * x[size_t(i) * 10 + k];
                } else {
                    v = l.b2[o];
                    for (int hh = 0; hh < 6; ++hh) {
                        double a = l.b1[hh];
                        for (int k = 0; k < 10; ++k) a += double(l.w1[size_t(hh) * 10 + k]) * x[size_t(i) * 10 + k];
                        v += double(l.w2[size_t(o) * 6 + hh]) * 0.5 * a * (1.0 + std::erf(a / std::sqrt(2.0)));
                    }
                }
                EXPECT_NEAR(y[size_t(i) * 2 + o], v, 1e-4) << "row " << i << " output " << o;
            }
    }
    const std::string path = dir + "/nested/linear.kvzap", bytes = file_bytes(path);
    expect_error([&] { Surrogate::load(path, std::string(64, 'b')); }, "not for this model file");
    write_bytes(dir + "/short.kvzap", bytes.substr(0, bytes.size() - 5));
    expect_error([&] { Surrogate::load(dir + "/short.kvzap"); }, "truncated");
    std::string flipped = bytes;
    flipped[flipped.size() - 3] ^= 0x10;
    write_bytes(dir + "/flipped.kvzap", flipped);
    expect_error([&] { Surrogate::load(dir + "/flipped.kvzap"); }, "checksum");
    std::string magic = bytes;
    magic[0] = 'X';
    write_bytes(dir + "/magic.kvzap", magic);
    expect_error([&] { Surrogate::load(dir + "/magic.kvzap"); }, "bad magic");
    std::string version = bytes;
    version[8] = 9;
    write_bytes(dir + "/version.kvzap", version);
    expect_error([&] { Surrogate::load(dir + "/version.kvzap"); }, "version 9");
    expect_error([&] { Surrogate::load(dir + "/missing.kvzap"); }, "cannot open");
    std::filesystem::remove_all(dir);
}

constexpr int64_t k_L = 150, k_sink = 4;  // kvzap's default sinks

class Kvzap : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 3;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.seed = 23;
        spec.n_ctx_train = 512;
        tiny_ = test::load_tiny_model(spec, "kvzap", k_L).release();
        tok_ = new Tokenizer(tiny_->model->path());
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete tiny_;
    }
    static const Model & model() { return *tiny_->model; }
    static std::vector<int32_t> context() { return tiny_->tokens; }

    // [layer][L][n_embd]: the hidden states entering each layer's attention, from a prefill of ctx.
    static std::vector<std::vector<float>> hidden_states(Engine & engine, const std::vector<int32_t> & ctx) {
        const HParams & hp = model().hparams();
        std::vector<std::vector<float>> x(hp.n_layer, std::vector<float>(ctx.size() * hp.n_embd));
        QueryObserver obs;
        obs.on_hidden = [&](int il, int64_t tok0, int64_t n, const float * h) {
            std::copy(h, h + n * hp.n_embd, x[il].begin() + tok0 * hp.n_embd);
        };
        KvStore cache = engine.new_cache(int64_t(ctx.size()));
        engine.prefill(cache, ctx, nullptr, nullptr, &obs);
        return x;
    }

    // A random linear surrogate for the tiny model, saved; returns its path.
    static std::string saved_surrogate(const std::string & dir, Surrogate * out) {
        const HParams & hp = model().hparams();
        Surrogate s = random_surrogate(Surrogate::Kind::linear, hp.n_layer, hp.n_embd, hp.n_head_kv, 0, 17);
        s.model = {{"name", "tiny"}, {"sha256", model().file_sha256()}, {"arch", hp.arch}};
        const std::string path = dir + "/tiny.kvzap";
        s.save(path);
        *out = s;
        return path;
    }

    // [layer][head][L] predictions of s in double from captured hidden states.
    static std::vector<std::vector<std::vector<double>>> predicted(const Surrogate & s,
                                                                   const std::vector<std::vector<float>> & x) {
        const HParams & hp = model().hparams();
        std::vector<std::vector<std::vector<double>>> p(
            hp.n_layer, std::vector<std::vector<double>>(hp.n_head_kv, std::vector<double>(k_L)));
        for (int il = 0; il < hp.n_layer; ++il)
            for (int h = 0; h < hp.n_head_kv; ++h)
                for (int64_t j = 0; j < k_L; ++j) {
                    double v = s.layer(il).b1[h];
                    for (int e = 0; e < hp.n_embd; ++e)
                        v += double(s.layer(il).w1[size_t(h) * hp.n_embd + e]) * x[il][size_t(j) * hp.n_embd + e];
                    p[il][h][j] = v;
                }
        return p;
    }

    static inline test::TinyModel * tiny_ = nullptr;
    static inline Tokenizer * tok_ = nullptr;
};

// Layer 0's input is the RMS-normed token embedding times attn_norm: recomputed from the GGUF.
TEST_F(Kvzap, HiddenStatesAreTheNormedInputOfTheAttention) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    const std::vector<int32_t> all = context(), ctx(all.begin(), all.begin() + 20);
    const std::vector<std::vector<float>> x = hidden_states(engine, ctx);
    ggml_context * data = nullptr;
    gguf_context_ptr g(gguf_init_from_file(model().path().c_str(), {/*no_alloc=*/false, &data}));
    ggml_context_ptr data_ptr(data);
    const ggml_tensor * embd = ggml_get_tensor(data, "token_embd.weight");
    const ggml_tensor * norm = ggml_get_tensor(data, "blk.0.attn_norm.weight");
    ASSERT_TRUE(embd && norm && embd->type == GGML_TYPE_F32 && norm->type == GGML_TYPE_F32);
    for (size_t t = 0; t < ctx.size(); ++t) {
        const float * e = static_cast<const float *>(embd->data) + size_t(ctx[t]) * hp.n_embd;
        double ss = 0.0;
        for (int i = 0; i < hp.n_embd; ++i) ss += double(e[i]) * e[i];
        const double inv = 1.0 / std::sqrt(ss / hp.n_embd + 1e-5);
        for (int i = 0; i < hp.n_embd; ++i)
            ASSERT_NEAR(x[0][t * hp.n_embd + i], e[i] * inv * static_cast<const float *>(norm->data)[i], 1e-5)
                << "token " << t << " dim " << i;
    }
    EXPECT_NE(x[1], x[0]) << "later layers see the residual stream";
}

TEST_F(Kvzap, KeepsTheTopRowsOfItsRecomputedSurrogate) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    const std::string dir = test::temp_dir("kvzap");
    Surrogate s;
    const std::string path = saved_surrogate(dir, &s);
    constexpr int64_t window = 8;
    const auto ref = predicted(s, hidden_states(engine, context()));
    ContextSession session(engine, {{"kvzap", {{"scorer", path}, {"window", std::to_string(window)}}}},
                           SessionOptions{0, 0, tok_});
    session.prefill(context());
    const Budget budget = Budget::from_ratio(0.5);
    const PreparedCache p = session.compress(0, budget);
    const int64_t B = budget.per_layer(k_L);
    EXPECT_EQ(p.cache.total_rows(), B * hp.n_layer * hp.n_head_kv) << "one global threshold, the budget in all";
    double kept_min = 1e300, dropped_max = -1e300;
    std::vector<int64_t> per_layer;
    for (int il = 0; il < hp.n_layer; ++il) {
        int64_t rows = 0;
        for (int h = 0; h < hp.n_head_kv; ++h) {
            std::vector<bool> kept(k_L, false);
            for (int32_t x : p.cache.positions(il, h)) kept[x] = true;
            rows += int64_t(p.cache.positions(il, h).size());
            for (int64_t j = k_L - window; j < k_L; ++j) EXPECT_TRUE(kept[j]) << "window row " << j;
            for (int64_t j = 0; j < k_sink; ++j) EXPECT_TRUE(kept[j]) << "sink " << j;
            for (int64_t j = k_sink; j < k_L - window; ++j)
                (kept[j] ? kept_min : dropped_max) =
                    kept[j] ? std::min(kept_min, ref[il][h][j]) : std::max(dropped_max, ref[il][h][j]);
        }
        per_layer.push_back(rows);
    }
    EXPECT_GE(kept_min, dropped_max - 1e-4);
    EXPECT_NE(*std::min_element(per_layer.begin(), per_layer.end()),
              *std::max_element(per_layer.begin(), per_layer.end()))
        << "layers keep different counts";
    std::filesystem::remove_all(dir);
}

TEST_F(Kvzap, ThresholdModeKeepsExactlyTheRowsAtOrAboveIt) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    const std::string dir = test::temp_dir("kvzap-threshold");
    Surrogate s;
    const std::string path = saved_surrogate(dir, &s);
    constexpr int64_t window = 8;
    const auto ref = predicted(s, hidden_states(engine, context()));
    // a threshold in the middle of a wide gap between two predicted scores: float and double agree on every side
    std::vector<double> all;
    for (const auto & l : ref)
        for (const auto & h : l) all.insert(all.end(), h.begin() + k_sink, h.end() - window);
    std::sort(all.begin(), all.end());
    size_t at = all.size() / 3;
    while (at + 1 < all.size() && all[at + 1] - all[at] < 1e-3) ++at;
    ASSERT_LT(at + 1, all.size());
    const double t = 0.5 * (all[at] + all[at + 1]);
    ContextSession session(
        engine, {{"kvzap", {{"scorer", path}, {"window", std::to_string(window)}, {"threshold", std::to_string(t)}}}},
        SessionOptions{0, 0, tok_});
    session.prefill(context());
    const PreparedCache p = session.compress(0, Budget::from_ratio(0.5));
    int64_t expected_total = 0;
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h) {
            std::vector<int32_t> want;
            for (int64_t j = 0; j < k_L; ++j)
                if (j < k_sink || j >= k_L - window || ref[il][h][j] >= t) want.push_back(int32_t(j));
            EXPECT_EQ(p.cache.positions(il, h), want) << "layer " << il << " head " << h;
            expected_total += int64_t(want.size());
        }
    EXPECT_EQ(p.cache.total_rows(), expected_total);
    EXPECT_GT(p.stats.rows_before, p.stats.rows_after);
    expect_error(
        [&] {
            ContextSession bad(engine, {{"kvzap", {{"scorer", path}, {"threshold", "x1"}}}},
                               SessionOptions{0, 0, tok_});
        },
        "threshold must be a number");
    expect_error(
        [&] {
            ContextSession bad(engine, {{"kvzap", {{"scorer", dir + "/none.kvzap"}}}}, SessionOptions{0, 0, tok_});
        },
        "train-scorer");
    std::filesystem::remove_all(dir);
}

TEST_F(Kvzap, TrainingOnATinyModelWritesAScorerItsMethodReads) {
    Engine engine(model());
    const std::string dir = test::temp_dir("kvzap-train");
    ScorerTrainingOptions o;
    o.doc_tokens = 64;
    o.tokens = 64 * 10;
    o.samples_per_doc = 24;
    o.holdout = 0.2;
    int64_t calls = 0;
    o.progress = [&calls](int64_t, int64_t, const char *) { ++calls; };
    const Surrogate s = train_scorer(engine, *tok_, {{"addiction.txt", test::test_text("addiction.txt")}}, o);
    EXPECT_EQ(calls, 10);
    EXPECT_EQ(s.fit["held_out_texts"], 2);
    EXPECT_EQ(s.fit["layers"].size(), size_t(model().hparams().n_layer));
    EXPECT_EQ(s.training["training_samples"], 8 * 24);
    EXPECT_EQ(s.model["sha256"], model().file_sha256());
    for (const auto & l : s.fit["layers"]) EXPECT_TRUE(std::isfinite(l["r2"].get<double>())) << l.dump();
    const std::string path = dir + "/trained.kvzap";
    s.save(path);
    ContextSession session(engine, {{"kvzap", {{"scorer", path}, {"window", "8"}}}}, SessionOptions{0, 0, tok_});
    session.prefill(context());
    EXPECT_LT(session.compress(0, Budget::from_ratio(0.5)).cache.total_rows(), session.full().cache.total_rows());
    // the same seed: the same scorer
    o.progress = nullptr;
    const Surrogate again = train_scorer(engine, *tok_, {{"addiction.txt", test::test_text("addiction.txt")}}, o);
    EXPECT_EQ(again.layer(2).w1, s.layer(2).w1);
    std::filesystem::remove_all(dir);
}

TEST_F(Kvzap, TrainingAnMlpOnATinyModelWritesAScorerItsMethodReads) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    const std::string dir = test::temp_dir("kvzap-train-mlp");
    ScorerTrainingOptions o;
    o.kind = Surrogate::Kind::mlp;
    o.doc_tokens = 64;
    o.tokens = 64 * 10;
    o.samples_per_doc = 24;
    o.holdout = 0.2;
    o.n_hidden = 16;
    o.epochs = 3;
    o.batch = 32;
    std::vector<double> losses;
    o.epoch_progress = [&losses](int epoch, int epochs, double train, double, double) {
        EXPECT_EQ(epochs, 3);
        EXPECT_EQ(epoch, int(losses.size()) + 1);
        losses.push_back(train);
    };
    const std::vector<CorpusText> corpus = {{"addiction.txt", test::test_text("addiction.txt")}};
    const Surrogate s = train_scorer(engine, *tok_, corpus, o);
    EXPECT_EQ(losses.size(), 3u);
    EXPECT_EQ(s.kind(), Surrogate::Kind::mlp);
    EXPECT_EQ(s.n_hidden(), 16);
    EXPECT_EQ(s.training["training_samples"], 8 * 24);
    EXPECT_EQ(s.training["mlp"]["train_samples"].get<int64_t>() + s.training["mlp"]["valid_samples"].get<int64_t>(),
              8 * 24);
    EXPECT_EQ(s.training["mlp"]["train_loss"].size(), 3u);
    EXPECT_EQ(s.training["mlp"]["layers"].size(), size_t(hp.n_layer));
    EXPECT_FALSE(s.training.contains("alpha")) << "the ridge's penalty is not the MLP's";
    for (const auto & l : s.fit["layers"]) EXPECT_TRUE(std::isfinite(l["r2"].get<double>())) << l.dump();
    const std::string path = dir + "/trained-mlp.kvzap";
    s.save(path);
    const Surrogate loaded = Surrogate::load(path, model().file_sha256());
    EXPECT_EQ(loaded.kind(), Surrogate::Kind::mlp);
    EXPECT_EQ(loaded.layer(1).w2, s.layer(1).w2);
    ContextSession session(engine, {{"kvzap", {{"scorer", path}, {"kind", "mlp"}, {"window", "8"}}}},
                           SessionOptions{0, 0, tok_});
    session.prefill(context());
    EXPECT_LT(session.compress(0, Budget::from_ratio(0.5)).cache.total_rows(), session.full().cache.total_rows());
    // the same seed: the same weights; the engine's thread count does not matter
    o.epoch_progress = nullptr;
    Engine two(model(), EngineOptions{.n_threads = 2});
    const Surrogate again = train_scorer(two, *tok_, corpus, o);
    for (int il = 0; il < hp.n_layer; ++il) {
        EXPECT_EQ(again.layer(il).w1, s.layer(il).w1) << "layer " << il;
        EXPECT_EQ(again.layer(il).b1, s.layer(il).b1) << "layer " << il;
        EXPECT_EQ(again.layer(il).w2, s.layer(il).w2) << "layer " << il;
        EXPECT_EQ(again.layer(il).b2, s.layer(il).b2) << "layer " << il;
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvlab
