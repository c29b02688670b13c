// Compression while decoding on a tiny model: the cache never holds more than target + interval
// rows per segment at any step, positions stay original, and each compaction keeps what a plain
// reference recomputes from the rows before it (knorm: the key norms in double; streaming_llm:
// the sinks and the most recent rows; kvzap: the generated rows whose recomputed prediction is
// at or above the threshold, the window and the context; tova: the attention of the queries
// decoded since the last compression, recomputed in double). Teacher forcing through the
// same policy reproduces a generation's own logits exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "kvlab/decode_policy.h"
#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int64_t k_L = 100, k_gen = 160;

class DecodePolicyTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.seed = 31;
        spec.n_ctx_train = 512;
        tiny_ = test::load_tiny_model(spec, "decode-policy", k_L).release();
    }
    static void TearDownTestSuite() { delete tiny_; }
    static const Model & model() { return *tiny_->model; }

    // The context (all but the last token, which is the query) prefilled.
    static KvStore context_cache(Engine & engine) {
        KvStore cache = engine.new_cache(k_L);
        engine.prefill(cache, {tiny_->tokens.begin(), tiny_->tokens.end() - 1});
        return cache;
    }

    struct Snapshot {
        std::vector<int32_t> pos;
        std::vector<float> k;
    };
    // Generates k_gen tokens after the context under `policy`; before each step's hook, the
    // rows of every segment are snapshotted and `check(before, cache)` runs after it.
    static void generate(DecodePolicy & policy, Engine & engine, KvStore & cache,
                         const std::function<void(const std::vector<std::vector<Snapshot>> &, const KvStore &)> & check,
                         const QueryObserver * extra = nullptr) {
        const HParams & hp = model().hparams();
        policy.start(cache);
        const DecodeHook & inner = policy.hook();
        QueryObserver both;
        if (inner.observer && inner.observer->on_hidden)
            both.on_hidden = [&](int il, int64_t tok0, int64_t n, const float * x) {
                inner.observer->on_hidden(il, tok0, n, x);
                if (extra && extra->on_hidden) extra->on_hidden(il, tok0, n, x);
            };
        if (inner.observer && inner.observer->on_queries)
            both.on_queries = [&](int il, int64_t tok0, int64_t n, const float * q) {
                inner.observer->on_queries(il, tok0, n, q);
                if (extra && extra->on_queries) extra->on_queries(il, tok0, n, q);
            };
        DecodeHook hook;
        hook.observer = inner.observer ? &both : nullptr;
        hook.growth = inner.growth;
        hook.after_token = [&](KvStore & c) {
            std::vector<std::vector<Snapshot>> before(hp.n_layer, std::vector<Snapshot>(hp.n_head_kv));
            for (int il = 0; il < hp.n_layer; ++il)
                for (int h = 0; h < hp.n_head_kv; ++h) before[il][h] = {c.positions(il, h), c.read_k(il, h)};
            inner.after_token(c);
            check(before, c);
        };
        GenerateOptions go;
        go.max_tokens = int32_t(k_gen);
        go.stop_on_eog = false;
        go.decode = &hook;
        const GenerateResult r = engine.generate(cache, {tiny_->tokens.back()}, go);
        ASSERT_EQ(int64_t(r.tokens.size()), k_gen);
    }

    static inline test::TinyModel * tiny_ = nullptr;
};

TEST_F(DecodePolicyTest, KnormKeepsItsTargetAndTheTopKeysAtEveryStep) {
    Engine engine(model());
    KvStore cache = context_cache(engine);
    DecodePolicyOptions o;
    o.method = "knorm";
    o.interval = 16;
    o.target = 48;
    o.n_sink = 4;
    o.window = 8;
    DecodePolicy policy(o, model());
    int64_t compactions = 0;
    generate(policy, engine, cache, [&](const auto & before, const KvStore & c) {
        for (int il = 0; il < c.n_layer(); ++il)
            for (int h = 0; h < c.n_head_kv(); ++h) {
                const auto & pos = c.positions(il, h);
                ASSERT_LT(int64_t(pos.size()), o.target + o.interval) << "the bound holds at every step";
                ASSERT_TRUE(std::is_sorted(pos.begin(), pos.end()));
                const Snapshot & b = before[il][h];
                if (pos.size() == b.pos.size()) continue;
                if (il == 0 && h == 0) ++compactions;
                // the reference: sinks, window, and the candidates of the largest -||k|| (double)
                const int64_t n = int64_t(b.pos.size()), d = c.head_dim();
                std::vector<std::pair<double, int64_t>> cand;
                for (int64_t r = o.n_sink; r < n - o.window; ++r) {
                    double ss = 0.0;
                    for (int64_t e = 0; e < d; ++e) ss += double(b.k[size_t(r * d + e)]) * b.k[size_t(r * d + e)];
                    cand.emplace_back(-std::sqrt(ss), r);
                }
                std::sort(cand.begin(), cand.end(), [](auto x, auto y) { return x.first > y.first; });
                std::vector<int32_t> want;
                for (int64_t r = 0; r < o.n_sink; ++r) want.push_back(b.pos[size_t(r)]);
                for (int64_t i = 0; i < o.target - o.n_sink - o.window; ++i)
                    want.push_back(b.pos[size_t(cand[i].second)]);
                for (int64_t r = n - o.window; r < n; ++r) want.push_back(b.pos[size_t(r)]);
                std::sort(want.begin(), want.end());
                ASSERT_EQ(pos, want) << "layer " << il << " head " << h;
            }
    });
    EXPECT_EQ(compactions, policy.stats().compactions);
    EXPECT_EQ(compactions, (k_gen - 2) / o.interval + 1) << "at the first step, then every interval (k_gen - 1 steps)";
    EXPECT_LT(policy.stats().max_segment_rows, o.target + o.interval);
    EXPECT_EQ(cache.next_pos(), k_L + k_gen - 1) << "positions stay original";
}

TEST_F(DecodePolicyTest, StreamingKeepsTheSinksAndTheMostRecentRows) {
    Engine engine(model());
    KvStore cache = context_cache(engine);
    DecodePolicyOptions o;
    o.method = "streaming_llm";
    o.interval = 10;
    o.target = 40;
    DecodePolicy policy(o, model());
    generate(policy, engine, cache, [&](const auto & before, const KvStore & c) {
        const auto & pos = c.positions(0, 1);
        if (pos.size() == before[0][1].pos.size()) return;
        std::vector<int32_t> want = {0, 1, 2, 3};
        for (int32_t p = c.next_pos() - int32_t(o.target - 4); p < c.next_pos(); ++p) want.push_back(p);
        ASSERT_EQ(pos, want);
    });
    EXPECT_GT(policy.stats().compactions, 0);
}

TEST_F(DecodePolicyTest, KvzapDropsTheGeneratedRowsBelowItsThreshold) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    std::mt19937_64 rng(3);
    std::normal_distribution<float> nd(0.0f, 0.3f);
    std::vector<Surrogate::Layer> layers(size_t(hp.n_layer));
    for (auto & l : layers) {
        for (int i = 0; i < hp.n_head_kv * hp.n_embd; ++i) l.w1.push_back(nd(rng));
        l.b1.assign(size_t(hp.n_head_kv), 0.0f);
    }
    Surrogate s(Surrogate::Kind::linear, hp.n_embd, hp.n_head_kv, 0, layers);
    s.model = {{"name", "tiny"}, {"sha256", model().file_sha256()}, {"arch", hp.arch}};
    const std::string dir = test::temp_dir("decode-kvzap"), path = dir + "/s.kvzap";
    s.save(path);
    DecodePolicyOptions o;
    o.method = "kvzap";
    o.interval = 12;
    o.params = {{"scorer", path}, {"threshold", "0.05"}, {"window", "10"}};
    DecodePolicy policy(o, model());
    KvStore cache = context_cache(engine);
    // the predictions of each generated row, recomputed in double from its hidden states
    std::vector<std::vector<std::vector<double>>> pred(hp.n_layer, std::vector<std::vector<double>>(hp.n_head_kv));
    QueryObserver capture;
    capture.on_hidden = [&](int il, int64_t, int64_t, const float * x) {
        for (int h = 0; h < hp.n_head_kv; ++h) {
            double v = 0.0;
            for (int e = 0; e < hp.n_embd; ++e) v += double(layers[il].w1[size_t(h * hp.n_embd + e)]) * x[e];
            pred[il][h].push_back(v);
        }
    };
    generate(
        policy, engine, cache, [](const auto &, const KvStore &) {}, &capture);
    const int32_t first_gen = int32_t(k_L) - 1;  // the row of the query token is the first decoded one
    int64_t dropped = 0;
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h) {
            const auto & pos = cache.positions(il, h);
            for (int32_t p = 0; p < first_gen; ++p)
                EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), p)) << "context row " << p;
            // rows compacted at the last compaction: those generated before it, out of its window
            const int32_t last =
                first_gen + int32_t((k_gen - 2) / o.interval * o.interval + 1);  // the last compaction's step
            for (size_t i = 0; i < pred[il][h].size(); ++i) {
                const int32_t p = first_gen + 1 + int32_t(i);
                if (p >= last - 10 || std::fabs(pred[il][h][i] - 0.05) < 1e-4) continue;
                const bool kept = std::binary_search(pos.begin(), pos.end(), p);
                EXPECT_EQ(kept, pred[il][h][i] >= 0.05) << "layer " << il << " head " << h << " position " << p;
                dropped += !kept;
            }
        }
    EXPECT_GT(dropped, 0);
    EXPECT_THROW(DecodePolicy({.method = "kvzap", .params = {{"scorer", path}}}, model()), Error);
    EXPECT_THROW(DecodePolicy({.method = "h2o"}, model()), Error);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvlab

namespace kvlab {
namespace {

TEST_F(DecodePolicyTest, TovaKeepsTheRowsTheIntervalsQueriesAttendedMost) {
    Engine engine(model());
    const HParams & hp = model().hparams();
    KvStore cache = context_cache(engine);
    DecodePolicyOptions o;
    o.method = "tova";
    o.interval = 8;
    o.target = 40;
    o.n_sink = 2;
    o.window = 4;
    DecodePolicy policy(o, model());
    // the queries decoded since the last compression: [step][layer][n_head * head_dim]
    std::vector<std::vector<std::vector<float>>> since;
    std::vector<std::vector<float>> current(size_t(hp.n_layer));
    QueryObserver capture;
    capture.on_queries = [&](int il, int64_t, int64_t n, const float * q) {
        const size_t per = size_t(hp.n_head) * hp.head_dim;
        current[size_t(il)].assign(q + (n - 1) * int64_t(per), q + n * int64_t(per));
    };
    int64_t step = 0, checked = 0;
    generate(
        policy, engine, cache,
        [&](const auto & before, const KvStore & c) {
            ++step;
            since.push_back(current);
            const bool compressing = step == 1 || (step - 1) % o.interval == 0;
            if (!compressing) return;
            const int32_t last_pos = c.next_pos() - 1;
            for (int il = 0; il < c.n_layer(); ++il)
                for (int h = 0; h < c.n_head_kv(); ++h) {
                    const Snapshot & b = before[size_t(il)][size_t(h)];
                    const int64_t n = int64_t(b.pos.size()), d = hp.head_dim;
                    ASSERT_LT(int64_t(c.positions(il, h).size()), o.target + o.interval);
                    if (n <= o.target) continue;
                    // the reference: softmax of each query over the rows it saw, mean over the
                    // queries that saw a row and the group's heads (double)
                    std::vector<double> sum(size_t(n), 0.0), cnt(size_t(n), 0.0);
                    for (size_t t = 0; t < since.size(); ++t) {
                        const int32_t p = last_pos - int32_t(since.size() - 1 - t);
                        int64_t seen = 0;
                        while (seen < n && b.pos[size_t(seen)] <= p) ++seen;
                        for (int g = 0; g < hp.n_gqa(); ++g) {
                            const float * q = since[t][size_t(il)].data() + size_t(h * hp.n_gqa() + g) * d;
                            std::vector<double> lg(static_cast<size_t>(seen));
                            double mx = -1e300, z = 0.0;
                            for (int64_t r = 0; r < seen; ++r) {
                                double dot = 0.0;
                                for (int64_t e = 0; e < d; ++e) dot += double(q[e]) * b.k[size_t(r * d + e)];
                                lg[size_t(r)] = dot / std::sqrt(double(d));
                                mx = std::max(mx, lg[size_t(r)]);
                            }
                            for (double & v : lg) z += (v = std::exp(v - mx));
                            for (int64_t r = 0; r < seen; ++r) sum[size_t(r)] += lg[size_t(r)] / z, cnt[size_t(r)] += 1;
                        }
                    }
                    std::vector<std::pair<double, int64_t>> cand;
                    for (int64_t r = o.n_sink; r < n - o.window; ++r)
                        cand.emplace_back(cnt[size_t(r)] > 0 ? sum[size_t(r)] / cnt[size_t(r)] : 0.0, r);
                    std::sort(cand.begin(), cand.end(), [](auto x, auto y) { return x.first > y.first; });
                    const int64_t keep = o.target - o.n_sink - o.window;
                    // a near-tie at the cut may fall either way in float
                    if (keep < int64_t(cand.size()) &&
                        cand[size_t(keep - 1)].first - cand[size_t(keep)].first < 1e-6 * cand[0].first)
                        continue;
                    std::vector<int32_t> want;
                    for (int64_t r = 0; r < o.n_sink; ++r) want.push_back(b.pos[size_t(r)]);
                    for (int64_t i = 0; i < keep; ++i) want.push_back(b.pos[size_t(cand[size_t(i)].second)]);
                    for (int64_t r = n - o.window; r < n; ++r) want.push_back(b.pos[size_t(r)]);
                    std::sort(want.begin(), want.end());
                    ASSERT_EQ(c.positions(il, h), want) << "layer " << il << " head " << h << " step " << step;
                    ++checked;
                }
            since.clear();
        },
        &capture);
    EXPECT_GT(checked, 4);
    EXPECT_GT(policy.stats().rows_dropped, 0);
}

TEST_F(DecodePolicyTest, TeacherForcingThroughThePolicyReproducesTheGenerationsLogits) {
    Engine engine(model());
    DecodePolicyOptions o;
    o.method = "knorm";
    o.interval = 8;
    o.target = 40;
    DecodePolicy policy(o, model());
    KvStore a = context_cache(engine), b = context_cache(engine);
    GenerateOptions go;
    go.max_tokens = 60;
    go.stop_on_eog = false;
    go.decode = &policy.hook();
    std::vector<float> generated, forced;
    go.step_logits = &generated;
    policy.start(a);
    const GenerateResult r = engine.generate(a, {tiny_->tokens.back()}, go);
    ASSERT_EQ(r.tokens.size(), 60u);
    const int64_t compactions = policy.stats().compactions;
    EXPECT_GT(compactions, 0);
    EXPECT_GE(r.kv_peak_bytes, a.bytes()) << "the peak is at least what the cache holds at the end";
    go.forced = &r.tokens;
    go.step_logits = &forced;
    policy.start(b);
    const GenerateResult f = engine.generate(b, {tiny_->tokens.back()}, go);
    EXPECT_EQ(f.tokens, r.tokens);
    EXPECT_EQ(policy.stats().compactions, compactions);
    ASSERT_EQ(forced.size(), generated.size());
    EXPECT_EQ(forced, generated) << "the same steps, compactions and arithmetic";
    EXPECT_EQ(a.positions(1, 1), b.positions(1, 1));
}

}  // namespace
}  // namespace kvlab
