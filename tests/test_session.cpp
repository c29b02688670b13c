// The context session on a tiny random-weight model: one reserve policy for the full and the
// compressed caches (exact bytes); one observation serves several budgets exactly as
// separate prefills do; answers come from copies (the prepared cache is unchanged) and equal
// a plain engine run; the query-aware split; a context too long for the reserve is refused.
#include <gtest/gtest.h>

#include <filesystem>

#include "kvlab/error.h"
#include "kvlab/session.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int64_t k_L = 120;

class Session : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.seed = 7;
        spec.n_ctx_train = 256;
        spec.weight_type = GGML_TYPE_Q8_0;
        tiny_ = test::load_tiny_model(spec, "session", k_L + 6).release();
        model_ = tiny_->model.get();
        tokens_ = &tiny_->tokens;
    }
    static void TearDownTestSuite() { delete tiny_; }
    static std::vector<int32_t> context() { return {tokens_->begin(), tokens_->begin() + k_L}; }
    static std::vector<int32_t> query() { return {tokens_->begin() + k_L, tokens_->end()}; }
    static GenerateOptions greedy(int n) {
        GenerateOptions go;
        go.max_tokens = n;
        go.stop_on_eog = false;
        return go;
    }
    static inline test::TinyModel * tiny_ = nullptr;
    static inline Model * model_ = nullptr;
    static inline std::vector<int32_t> * tokens_ = nullptr;
};

TEST_F(Session, OneReservePolicyForFullAndCompressedCaches) {
    Engine engine(*model_);
    const SessionOptions so{int64_t(query().size()), 8};
    ContextSession s(engine, {{"snapkv", {{"window", "8"}}}, {"knorm", {}}}, so);
    s.prefill(context());
    EXPECT_EQ(s.reserve(), int64_t(query().size()) + 8);
    const HParams & hp = model_->hparams();
    const PreparedCache full = s.full();
    EXPECT_EQ(full.cache.bytes(), uint64_t(k_L + s.reserve()) * full.cache.row_bytes() * hp.n_layer * hp.n_head_kv);
    EXPECT_EQ(full.stats.rows_after, k_L * hp.n_layer * hp.n_head_kv);
    for (size_t m = 0; m < s.n_methods(); ++m) {
        const PreparedCache c = s.compress(m, Budget::from_tokens(40));
        EXPECT_EQ(c.cache.total_rows(), 40 * hp.n_layer * hp.n_head_kv) << s.press(m).name();
        EXPECT_EQ(c.cache.bytes(), uint64_t(40 + s.reserve()) * c.cache.row_bytes() * hp.n_layer * hp.n_head_kv);
        // answering and teacher forcing the answer fit in the reserve: the cache never grows
        KvStore work = c.cache.copy();
        const GenerateResult r = engine.generate(work, query(), greedy(8));
        EXPECT_EQ(work.bytes(), c.cache.bytes());
        EXPECT_EQ(int64_t(s.teacher_forced(c.cache, query(), r.tokens).size()), 8 * hp.n_vocab);
    }
}

TEST_F(Session, OneObservationServesEveryBudgetAsSeparatePrefillsDo) {
    Engine engine(*model_);
    const SessionOptions so{int64_t(query().size()), 4};
    const std::vector<MethodRequest> methods = {{"h2o", {}}, {"snapkv", {{"window", "8"}}}};
    ContextSession shared(engine, methods, so);
    shared.prefill(context());
    for (const Budget & b : {Budget::from_ratio(0.5), Budget::from_tokens(30), Budget::from_ratio(0.25)})
        for (size_t m = 0; m < methods.size(); ++m) {
            ContextSession alone(engine, {methods[m]}, so);
            alone.prefill(context());
            const PreparedCache a = shared.compress(m, b), c = alone.compress(0, b);
            for (int il = 0; il < a.cache.n_layer(); ++il)
                for (int h = 0; h < a.cache.n_head_kv(); ++h)
                    EXPECT_EQ(a.cache.positions(il, h), c.cache.positions(il, h))
                        << methods[m].name << " " << b.describe() << " layer " << il << " head " << h;
        }
}

TEST_F(Session, AnswersComeFromCopiesAndEqualAPlainEngineRun) {
    Engine engine(*model_);
    ContextSession s(engine, {}, SessionOptions{int64_t(query().size()), 6});
    s.prefill(context());
    const PreparedCache full = s.full();
    const std::vector<int32_t> before = full.cache.positions(0, 0);
    const GenerateResult a = s.answer(full.cache, query(), greedy(6));
    const GenerateResult b = s.answer(full.cache, query(), greedy(6));
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(full.cache.positions(0, 0), before);
    KvStore plain = engine.new_cache(k_L);
    engine.prefill(plain, context());
    EXPECT_EQ(engine.generate(plain, query(), greedy(6)).tokens, a.tokens);
    EXPECT_GT(s.prefill_stats().seconds, 0.0);
    EXPECT_EQ(s.context_tokens(), k_L);
}

TEST_F(Session, QueryAwareSplitMovesTheQuestionIntoTheContext) {
    const Tokenizer::SplitPrompt p{{1, 2, 3}, {4, 5, 6}};
    const ContextQuery agnostic = split_query(p, false), aware = split_query(p, true);
    EXPECT_EQ(agnostic.context, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(agnostic.query, (std::vector<int32_t>{4, 5, 6}));
    EXPECT_EQ(aware.context, (std::vector<int32_t>{1, 2, 3, 4, 5}));
    EXPECT_EQ(aware.query, (std::vector<int32_t>{6}));
}

TEST_F(Session, RefusesWhatCannotFitAndBadMethods) {
    Engine engine(*model_);
    EXPECT_THROW(ContextSession(engine, {{"snapkvv", {}}}, SessionOptions{1, 1}), Error);
    ContextSession s(engine, {}, SessionOptions{100, 100});  // 120 + 200 > 256
    try {
        s.prefill(context());
        ADD_FAILURE() << "no error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("exceeds the model's context of 256 tokens"), std::string::npos)
            << e.what();
    }
    EXPECT_THROW(s.full(), Error);  // nothing prefilled
}

}  // namespace
}  // namespace kvlab
