// The method seam: a method registered in one file (this one: `test_oldest`, which keeps the oldest
// rows) is a prefill compression method (make_press, ContextSession) and a decoding policy
// (DecodePolicy) without another file touched; and every registered method's declared
// MethodInfo::observes is what its press does (asks the prefill for an observer or runs passes
// of its own), since the front ends decide from it whether a cache must be prefilled again.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "kvlab/decode_policy.h"
#include "kvlab/error.h"
#include "kvlab/session.h"
#include "press/method.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

// The method under test: a row's score is minus its position (the oldest rows kept first).
std::vector<float> oldest_first(const KvStore & cache, int il, int h) {
    const std::vector<int32_t> & pos = cache.positions(il, h);
    std::vector<float> s(pos.size());
    for (size_t r = 0; r < pos.size(); ++r) s[r] = -float(pos[r]);
    return s;
}

class OldestScorer : public press::Scorer {
public:
    press::Scores score(const KvStore & cache) override { return press::score_segments(cache, 1, oldest_first); }
};

const press::MethodRegistrar reg([] {
    press::Registration r = press::uniform_method(
        MethodInfo{"test_oldest", "test: keeps the oldest rows (tests/test_method_seam.cpp)", {}, false, false},
        [](const press::Params &, const Model &) -> std::unique_ptr<press::Scorer> {
            return std::make_unique<OldestScorer>();
        });
    r.segment = [](const ParamMap & params, const Model &) {
        press::refuse_decode_params("test_oldest", params);
        return press::stateless_segment_scorer(oldest_first);
    };
    return r;
});

constexpr int64_t k_L = 80, k_gen = 60;

class MethodSeam : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.seed = 11;
        spec.n_ctx_train = 512;
        tiny_ = test::load_tiny_model(spec, "method-seam", k_L).release();
    }
    static void TearDownTestSuite() { delete tiny_; }
    static const Model & model() { return *tiny_->model; }
    static std::vector<int32_t> context() { return {tiny_->tokens.begin(), tiny_->tokens.end() - 1}; }
    static inline test::TinyModel * tiny_ = nullptr;
};

TEST_F(MethodSeam, ARegisteredMethodCompressesAPrefill) {
    Engine engine(model());
    ContextSession s(engine, {{"test_oldest", {}}}, SessionOptions{});
    s.prefill(context());
    const PreparedCache p = s.compress(0, Budget::from_tokens(30));
    std::vector<int32_t> want(30);
    std::iota(want.begin(), want.end(), 0);
    for (int il = 0; il < p.cache.n_layer(); ++il)
        for (int h = 0; h < p.cache.n_head_kv(); ++h) EXPECT_EQ(p.cache.positions(il, h), want);
}

TEST_F(MethodSeam, ARegisteredMethodWithASegmentScorerIsADecodingPolicy) {
    const std::vector<std::string> methods = decode_policy_methods();
    EXPECT_NE(std::find(methods.begin(), methods.end(), "test_oldest"), methods.end());
    for (const char * m : {"knorm", "keydiff", "streaming_llm", "tova", "kvzap"})
        EXPECT_NE(std::find(methods.begin(), methods.end(), m), methods.end()) << m;
    EXPECT_EQ(std::find(methods.begin(), methods.end(), "snapkv"), methods.end()) << "snapkv cannot score segments";
    EXPECT_THROW(DecodePolicy({.method = "snapkv"}, model()), Error);
    EXPECT_THROW(DecodePolicy({.method = "test_oldest", .params = {{"x", "1"}}}, model()), Error);

    Engine engine(model());
    KvStore cache = engine.new_cache(k_L);
    engine.prefill(cache, context());
    DecodePolicyOptions o;
    o.method = "test_oldest";
    o.interval = 8;
    o.target = 40;
    o.n_sink = 2;
    o.window = 6;
    DecodePolicy policy(o, model());
    policy.start(cache);
    int64_t steps = 0;
    DecodeHook hook = policy.hook();
    hook.after_token = [&](KvStore & c) {
        policy.hook().after_token(c);
        ++steps;
        if ((steps - 1) % o.interval != 0) return;  // the first step, then every interval, compresses
        // sinks 0, 1; the oldest others (2 .. target - window - 1); the window's most recent rows
        for (int il = 0; il < c.n_layer(); ++il)
            for (int h = 0; h < c.n_head_kv(); ++h) {
                std::vector<int32_t> want(size_t(o.target - o.window));
                std::iota(want.begin(), want.end(), 0);
                for (int32_t p = c.next_pos() - int32_t(o.window); p < c.next_pos(); ++p) want.push_back(p);
                ASSERT_EQ(c.positions(il, h), want) << "step " << steps << " layer " << il << " head " << h;
            }
    };
    GenerateOptions go;
    go.max_tokens = int32_t(k_gen);
    go.stop_on_eog = false;
    go.decode = &hook;
    const GenerateResult r = engine.generate(cache, {tiny_->tokens.back()}, go);
    EXPECT_EQ(int64_t(r.tokens.size()), k_gen);
    EXPECT_EQ(policy.stats().compactions, (k_gen - 2) / o.interval + 1);
    // another generation's policy: the same options, its own state
    const std::unique_ptr<DecodePolicy> again = policy.another();
    EXPECT_EQ(again->stats().compactions, 0);
    EXPECT_EQ(again->hook().growth, o.interval);
}

TEST_F(MethodSeam, EveryMethodSaysWhetherItObservesThePrefill) {
    const std::string dir = test::temp_dir("method-seam");
    for (const MethodInfo & m : press_methods()) {
        SCOPED_TRACE(m.name);
        std::unique_ptr<Press> p = make_press(m.name, test::method_test_params(m.name, model(), dir), model());
        Engine engine(model());
        KvStore probe = engine.new_cache(k_L);
        const bool asks = p->has_scoring_passes() || p->observer(probe, k_L) != nullptr;
        EXPECT_EQ(p->observes(), asks);
    }
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvlab
