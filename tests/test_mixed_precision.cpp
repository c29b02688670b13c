// Byte budgets and mixed precision (docs/methods.md, "Mixed precision") on a tiny random-weight
// model whose head_dim (64) makes quantized rows rotated: a byte budget is met as reported
// and gives the counts its formula says; an F16 byte budget without demotion keeps the same
// rows as the equal row budget (the eviction end); every row demoted with no eviction (the
// quantization end); answers from mixed caches do not depend on how the query is batched;
// bad budgets are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/session.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int64_t k_L = 200;

class MixedPrecision : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_embd = 256;
        spec.head_dim = 64;
        spec.seed = 23;
        spec.n_ctx_train = 512;
        spec.weight_type = GGML_TYPE_Q8_0;
        tiny_ = test::load_tiny_model(spec, "mixed", k_L + 6).release();
    }
    static void TearDownTestSuite() { delete tiny_; }
    static const Model & model() { return *tiny_->model; }
    static std::vector<int32_t> context() { return {tiny_->tokens.begin(), tiny_->tokens.begin() + k_L}; }
    static std::vector<int32_t> query() { return {tiny_->tokens.begin() + k_L, tiny_->tokens.end()}; }
    static Budget bytes(double r, ggml_type demote = GGML_TYPE_COUNT, double share = -1.0) {
        Budget b = Budget::from_bytes_ratio(r);
        b.set_demotion(demote, share);
        return b;
    }
    static inline test::TinyModel * tiny_ = nullptr;
};

// Full cache bytes at F16 of the context: every layer global here.
uint64_t full_f16_bytes(const KvStore & c) {
    return uint64_t(k_L) * c.n_layer() * c.n_head_kv() * 2 * ggml_row_size(GGML_TYPE_F16, c.head_dim());
}

TEST_F(MixedPrecision, ByteBudgetsAreMetAsReported) {
    Engine engine(model());
    const std::vector<MethodRequest> methods = {{"knorm", {}},
                                                {"streaming_llm", {}},
                                                {"snapkv", {{"window", "8"}}},
                                                {"pyramidkv", {{"window", "8"}}},
                                                {"adakv", {}}};
    ContextSession s(engine, methods, SessionOptions{int64_t(query().size()), 0});
    s.prefill(context());
    const uint64_t full = full_f16_bytes(s.prefilled());
    const uint64_t h = 2 * ggml_row_size(GGML_TYPE_F16, 64);
    for (size_t m = 0; m < s.n_methods(); ++m)
        for (const double r : {0.2, 0.5})
            for (const ggml_type demote : {GGML_TYPE_COUNT, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0})
                for (const double share : {-1.0, 0.5}) {
                    if (demote == GGML_TYPE_COUNT && share >= 0.0) continue;
                    const Budget b = bytes(r, demote, share);
                    SCOPED_TRACE(s.press(m).name() + ", " + b.describe());
                    const PreparedCache p = s.compress(m, b);
                    const int64_t B = int64_t(std::floor(r * double(full)));
                    EXPECT_EQ(p.stats.budget_bytes, B);
                    EXPECT_EQ(p.stats.used_after, p.cache.used_bytes());
                    EXPECT_LE(p.stats.used_after, uint64_t(B));
                    EXPECT_EQ(p.stats.rows_demoted, p.cache.total_low_rows());
                    // the counts per segment follow the formula (4 segments, L rows each)
                    const double per = double(B) / 4.0;
                    const double l = demote == GGML_TYPE_COUNT ? 0.0 : 2.0 * double(ggml_row_size(demote, 64));
                    int64_t high = 0, total = 0;
                    if (demote == GGML_TYPE_COUNT) {
                        high = total = int64_t(per / double(h));
                    } else if (share >= 0.0) {
                        high = int64_t(share * per / double(h));
                        total = std::min<int64_t>(k_L, high + int64_t((per - double(high * int64_t(h))) / l));
                    } else if (double(k_L) * l <= per) {
                        total = k_L;
                        high = int64_t((per - double(k_L) * l) / (double(h) - l));
                    } else {
                        total = int64_t(per / l);
                    }
                    EXPECT_EQ(p.stats.rows_high, high);
                    EXPECT_EQ(p.stats.rows_total, total);
                    EXPECT_EQ(p.cache.total_rows(), 4 * total);  // every method keeps the budget's rows
                    if (s.press(m).name() == "knorm" || s.press(m).name() == "streaming_llm") {
                        // uniform methods: every segment holds exactly the counts, so the bytes are exact
                        for (int il = 0; il < 2; ++il)
                            for (int hd = 0; hd < 2; ++hd) {
                                EXPECT_EQ(p.cache.n_rows(il, hd) + p.cache.n_low(il, hd), total);
                                EXPECT_EQ(p.cache.n_low(il, hd), demote == GGML_TYPE_COUNT ? 0 : total - high);
                            }
                        EXPECT_EQ(p.stats.used_after,
                                  uint64_t(4 * high) * h + uint64_t(4 * (total - high)) * uint64_t(l));
                    }
                }
}

// The two ends of the policy: no demotion at F16 is eviction (the rows of the equal row
// budget); every row demoted with nothing evicted is quantization alone.
TEST_F(MixedPrecision, EvictionAndQuantizationAreTheTwoEnds) {
    Engine engine(model());
    ContextSession s(engine, {{"knorm", {}}, {"snapkv", {{"window", "8"}}}}, SessionOptions{0, 0});
    s.prefill(context());
    for (size_t m = 0; m < s.n_methods(); ++m) {
        const PreparedCache by_bytes = s.compress(m, bytes(0.5));
        const PreparedCache by_rows = s.compress(m, Budget::from_ratio(0.5));
        for (int il = 0; il < 2; ++il)
            for (int h = 0; h < 2; ++h) EXPECT_EQ(by_bytes.cache.positions(il, h), by_rows.cache.positions(il, h));
        EXPECT_FALSE(by_bytes.cache.types().mixed());
        const PreparedCache all_low = s.compress(m, bytes(1.0, GGML_TYPE_Q8_0, 0.0));
        EXPECT_EQ(all_low.cache.total_low_rows(), k_L * 4);
        EXPECT_EQ(all_low.cache.total_rows(), k_L * 4);
        EXPECT_EQ(all_low.stats.used_after, uint64_t(k_L) * 4 * 2 * ggml_row_size(GGML_TYPE_Q8_0, 64));
        // a ratio budget that demotes: the method's rows stay at F16, every other row is demoted
        Budget rb = Budget::from_ratio(0.75);
        rb.set_demotion(GGML_TYPE_Q4_0, -1.0);
        const PreparedCache ratio_low = s.compress(m, rb);
        const PreparedCache evicted = s.compress(m, Budget::from_ratio(0.75));
        for (int il = 0; il < 2; ++il)
            for (int h = 0; h < 2; ++h) {
                EXPECT_EQ(ratio_low.cache.positions(il, h), evicted.cache.positions(il, h));
                EXPECT_EQ(ratio_low.cache.n_rows(il, h) + ratio_low.cache.n_low(il, h), k_L);
            }
    }
}

// A query over a mixed cache (rotated F16 rows and Q4_0 demoted rows, new rows appended
// rotated) gives the same logits in one batch as one token at a time, and other logits than
// the evicted cache (the demoted rows are attended).
TEST_F(MixedPrecision, AnswersDoNotDependOnBatching) {
    Engine engine(model());
    ContextSession s(engine, {{"knorm", {}}}, SessionOptions{int64_t(query().size()), 0});
    s.prefill(context());
    const PreparedCache p = s.compress(0, bytes(0.3, GGML_TYPE_Q4_0));
    ASSERT_GT(p.cache.total_low_rows(), 0);
    ASSERT_GT(p.cache.total_rows(), p.cache.total_low_rows());
    EXPECT_GT(p.cache.types().k_rotation(64), 0);
    std::vector<float> batched, single;
    KvStore a = p.cache.copy(int64_t(query().size())), b = p.cache.copy(int64_t(query().size()));
    Engine(model(), EngineOptions{64}).prefill(a, query(), nullptr, &batched);
    Engine(model(), EngineOptions{1}).prefill(b, query(), nullptr, &single);
    EXPECT_EQ(test::compare_logits(batched, single, model().hparams().n_vocab).max_abs, 0.0f);
    EXPECT_EQ(a.total_low_rows(), p.cache.total_low_rows());  // new rows go to the first run
    // the evicted cache with the same high rows answers otherwise
    Budget evict = Budget::from_bytes_ratio(0.3);
    evict.set_demotion(GGML_TYPE_Q4_0, 1.0);  // all the bytes at F16: nothing demoted
    const PreparedCache e = s.compress(0, evict);
    EXPECT_EQ(e.cache.total_low_rows(), 0);
    std::vector<float> evicted;
    KvStore c = e.cache.copy(int64_t(query().size()));
    Engine(model(), EngineOptions{64}).prefill(c, query(), nullptr, &evicted);
    EXPECT_GT(test::compare_logits(batched, evicted, model().hparams().n_vocab).max_abs, 0.0f);
}

TEST_F(MixedPrecision, BadBudgetsAreRefused) {
    EXPECT_THROW(Budget::from_bytes_ratio(0.0), Error);
    EXPECT_THROW(Budget::from_bytes_ratio(1.5), Error);
    EXPECT_THROW(Budget::from_bytes(0), Error);
    Budget b = Budget::from_bytes(1000);
    EXPECT_THROW(b.set_demotion(GGML_TYPE_F16, -1.0), Error);
    EXPECT_THROW(b.set_demotion(GGML_TYPE_Q4_0, 1.5), Error);
    EXPECT_THROW(b.set_demotion(GGML_TYPE_COUNT, 0.5), Error);
    EXPECT_THROW(b.per_layer(100), Error);
    // JSON round trip and its errors
    b.set_demotion(GGML_TYPE_Q4_0, 0.25);
    const Budget r = Budget::from_json(b.to_json());
    EXPECT_EQ(r.kv_bytes, 1000);
    EXPECT_EQ(r.demote, GGML_TYPE_Q4_0);
    EXPECT_EQ(r.high_share, 0.25);
    EXPECT_EQ(Budget::from_json(nlohmann::json{{"bytes_ratio", 0.25}}).bytes_ratio, 0.25);
    EXPECT_THROW(Budget::from_json(nlohmann::json{{"bytes_ratio", 0.25}, {"ratio", 0.5}}), Error);
    EXPECT_THROW(Budget::from_json(nlohmann::json{{"kv_bytes", 1.5}}), Error);
    EXPECT_THROW(Budget::from_json(nlohmann::json{{"ratio", 0.5}, {"demote", "q5_0"}}), Error);
    EXPECT_THROW(Budget::from_json(nlohmann::json{{"ratio", 0.5}, {"high_share", 0.5}}), Error);
    // a budget too small for one row, and a second compression of a mixed cache
    Engine engine(model());
    ContextSession s(engine, {{"knorm", {}}}, SessionOptions{0, 0});
    s.prefill(context());
    EXPECT_THROW(s.compress(0, Budget::from_bytes(100)), Error);
    const PreparedCache p = s.compress(0, bytes(0.3, GGML_TYPE_Q4_0));
    auto press = make_press("knorm", {}, model());
    KvStore c = p.cache.copy();
    EXPECT_THROW(compress(*press, c, Budget::from_ratio(0.5), 0), Error);
    // demoting to a type that is not smaller than the cache's K and V rows frees nothing
    EXPECT_FALSE(demotion_saves(GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_0, 64));
    EXPECT_FALSE(demotion_saves(GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_Q8_0, 64));
    EXPECT_TRUE(demotion_saves(GGML_TYPE_Q8_0, GGML_TYPE_F16, GGML_TYPE_Q4_0, 64));
    ContextSession q4(engine, {{"knorm", {}}},
                      SessionOptions{0, 0, nullptr, CacheTypes{GGML_TYPE_Q4_0, GGML_TYPE_Q4_0}});
    q4.prefill(context());
    EXPECT_THROW(q4.compress(0, bytes(0.2, GGML_TYPE_Q4_0)), Error);
    EXPECT_NO_THROW(q4.compress(0, Budget::from_bytes_ratio(0.2)));
}

}  // namespace
}  // namespace kvlab
