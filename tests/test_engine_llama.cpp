// kvlab's engine against libllama on the real default model (SmolLM2-135M-Instruct Q4_1):
// logits at every position of a 512-token text, greedy generation, chunk sizes, copies.
#include <gtest/gtest.h>

#include <memory>

#include "ggml.h"
#include "kvlab/engine.h"
#include "kvlab/registry.h"
#include "kvlab/text.h"
#include "llama_ref.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

// Both engines run ggml's kernels on the same weights; what differs is the order of some
// reductions (fused ops in llama.cpp). The bound on |Δlogit| over a 49152-token vocabulary:
constexpr float k_logit_bound = 1e-2f;
constexpr int k_threads = 2;

class RealModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        path_ = new std::string(resolve_model("smollm2-135m"));
        model_ = Model::load(*path_, k_threads).release();
        tok_ = new Tokenizer(*path_);
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete model_;
        delete path_;
    }
    static std::vector<int32_t> text_tokens(size_t n) {
        std::vector<int32_t> t = tok_->encode(test::test_text("avg.txt"));
        EXPECT_GE(t.size(), n);
        t.resize(n);
        return t;
    }
    static std::vector<float> kvlab_logits(const std::vector<int32_t> & toks, int chunk) {
        Engine e(*model_, EngineOptions{chunk});
        KvStore c = e.new_cache(int64_t(toks.size()));
        std::vector<float> all;
        e.prefill(c, toks, nullptr, &all);
        return all;
    }
    static inline std::string * path_ = nullptr;
    static inline Model * model_ = nullptr;
    static inline Tokenizer * tok_ = nullptr;
};

TEST_F(RealModel, LogitsMatchLibllamaAt512Positions) {
    const auto toks = text_tokens(512);
    const auto ours = kvlab_logits(toks, 512);
    LlamaRef ref(*path_, k_threads, 1024);
    const auto theirs = ref.decode(toks, true);
    const auto d = test::compare_logits(ours, theirs, model_->hparams().n_vocab);
    EXPECT_EQ(d.top1_mismatch, 0) << "first top-1 mismatch at position " << d.first_mismatch;
    EXPECT_LT(d.max_abs, k_logit_bound);
    std::printf("[ measure  ] max |dlogit| vs libllama over 512 positions: %.3g\n", d.max_abs);
}

TEST_F(RealModel, Greedy64TokensMatchLibllama) {
    const auto prompt = tok_->chat({{"user", "Write a short story about a lighthouse keeper."}});
    Engine e(*model_);
    KvStore c = e.new_cache(int64_t(prompt.size()) + 64);
    GenerateOptions go;
    go.max_tokens = 64;
    go.stop_on_eog = false;
    const GenerateResult r = e.generate(c, prompt, go);
    LlamaRef ref(*path_, k_threads, 512);
    EXPECT_EQ(r.tokens, ref.greedy(prompt, 64));
}

TEST_F(RealModel, ChunkSizesGiveTheSameLogits) {
    const auto toks = text_tokens(512);
    const int64_t n_vocab = model_->hparams().n_vocab;
    const auto base = kvlab_logits(toks, 512);
    // From ggml's flash-attention Q tile (64 rows) up (every chunk, the last one included),
    // ggml's CPU kernel computes in F32:
    // chunk sizes there must agree within the bound.
    for (int chunk : {64, 128, 256}) {
        const auto d = test::compare_logits(kvlab_logits(toks, chunk), base, n_vocab);
        EXPECT_EQ(d.top1_mismatch, 0) << "chunk " << chunk;
        EXPECT_LT(d.max_abs, k_logit_bound) << "chunk " << chunk;
    }
    // Below the tile, ggml's CPU flash attention rounds Q to F16 and accumulates V in F16,
    // and libllama shows the same drift between its ubatch 1 and 512. kvlab's chunks 1 and 7
    // must stay within the drift libllama itself shows (10% margin) and agree on top-1 at
    // 95% of the positions or more. (A precise small-batch attention path is future work.)
    LlamaRef ref1(*path_, k_threads, 1024, 1);
    std::vector<float> ref_small;
    for (int32_t t : toks) {
        const auto row = ref1.decode({t}, true);
        ref_small.insert(ref_small.end(), row.begin(), row.end());
    }
    LlamaRef ref512(*path_, k_threads, 1024, 512);
    const auto ref_drift = test::compare_logits(ref_small, ref512.decode(toks, true), n_vocab);
    std::printf("[ measure  ] libllama ubatch 1 vs 512: max |dlogit| %.3g, top-1 mismatches %lld/512\n",
                ref_drift.max_abs, static_cast<long long>(ref_drift.top1_mismatch));
    for (int chunk : {1, 7}) {
        const auto d = test::compare_logits(kvlab_logits(toks, chunk), base, n_vocab);
        std::printf("[ measure  ] kvlab chunk %d vs 512: max |dlogit| %.3g, top-1 mismatches %lld/512\n", chunk,
                    d.max_abs, static_cast<long long>(d.top1_mismatch));
        EXPECT_LE(d.max_abs, 1.1f * ref_drift.max_abs) << "chunk " << chunk;
        EXPECT_LE(d.top1_mismatch, 512 / 20) << "chunk " << chunk;
    }
}

TEST_F(RealModel, GeneratingFromACopyLeavesTheOriginalUnchanged) {
    const auto toks = text_tokens(200);
    Engine e(*model_);
    KvStore orig = e.new_cache(256);
    e.prefill(orig, toks);
    const uint64_t used = orig.used_bytes();

    KvStore before = orig.copy();
    const auto next_before = e.prefill(before, {toks[0]});

    KvStore work = orig.copy();
    GenerateOptions go;
    go.max_tokens = 32;
    go.stop_on_eog = false;
    e.generate(work, tok_->encode(" And so", false), go);
    EXPECT_GT(work.used_bytes(), used);

    EXPECT_EQ(orig.used_bytes(), used);
    EXPECT_EQ(orig.next_pos(), 200);
    KvStore after = orig.copy();
    EXPECT_EQ(e.prefill(after, {toks[0]}), next_before);  // bit-identical
}

TEST_F(RealModel, CopyIsDeepAndBytesAreExact) {
    Engine e(*model_);
    KvStore c = e.new_cache(300);
    e.prefill(c, text_tokens(100));
    const HParams & hp = model_->hparams();
    const uint64_t row = 2ull * hp.head_dim * 2;  // K and V, F16
    EXPECT_EQ(c.used_bytes(), uint64_t(hp.n_layer) * hp.n_head_kv * 100 * row);
    EXPECT_EQ(c.bytes(), uint64_t(hp.n_layer) * hp.n_head_kv * 300 * row);
    KvStore d = c.copy();
    EXPECT_NE(d.k(0), c.k(0));
    EXPECT_NE(d.k(0)->data, c.k(0)->data);
    EXPECT_EQ(d.positions(3, 1), c.positions(3, 1));
    EXPECT_EQ(d.bytes(), c.bytes());
}

TEST_F(RealModel, ChatTemplateHasOneBos) {
    const auto t = tok_->chat({{"user", "hi"}});
    ASSERT_FALSE(t.empty());
    // SmolLM2's BOS is <|im_start|>, which the template also writes: exactly one at the start
    ASSERT_GE(t.size(), 2u);
    EXPECT_EQ(t[0], tok_->bos());
    EXPECT_NE(t[1], tok_->bos());
    EXPECT_NE(tok_->chat_text({{"user", "hi"}}).find("hi"), std::string::npos);
}

TEST_F(RealModel, EncodeDecodeRoundTrip) {
    // encode/decode round trip of real text through libllama's vocabulary
    const std::string s = test::test_text("addiction.txt").substr(0, 2000);
    const auto t = tok_->encode(s, false);
    EXPECT_EQ(tok_->decode(t), s);
}

}  // namespace
}  // namespace kvlab
