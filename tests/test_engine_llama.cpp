// kvlab's engine against libllama on the real default model (SmolLM2-135M-Instruct Q4_1):
// logits at every position of a 512-token text, greedy generation, chunk sizes, copies.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "ggml.h"
#include "kvlab/engine.h"
#include "kvlab/registry.h"
#include "kvlab/text.h"
#include "llama_ref.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

// With attention=ggml both engines run the same ggml kernels on the same weights; what
// may differ is the order of some reductions (fused ops in llama.cpp). The bound on
// |Δlogit| over a 49152-token vocabulary:
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
    static std::vector<float> kvlab_logits(const std::vector<int32_t> & toks, int chunk,
                                           AttentionKernel attn = AttentionKernel::kvlab) {
        Engine e(*model_, EngineOptions{chunk, attn});
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
    const auto ours = kvlab_logits(toks, 512, AttentionKernel::ggml);
    LlamaRef ref(*path_, k_threads, 1024);
    const auto theirs = ref.decode(toks, true);
    const auto d = test::compare_logits(ours, theirs, model_->hparams().n_vocab);
    EXPECT_EQ(d.top1_mismatch, 0) << "first top-1 mismatch at position " << d.first_mismatch;
    EXPECT_LT(d.max_abs, k_logit_bound);
    std::printf("[ measure  ] attention=ggml: max |dlogit| vs libllama over 512 positions: %.3g\n", d.max_abs);
}

TEST_F(RealModel, Greedy64TokensMatchLibllama) {
    const auto prompt = tok_->chat({{"user", "Write a short story about a lighthouse keeper."}});
    Engine e(*model_, EngineOptions{512, AttentionKernel::ggml});
    KvStore c = e.new_cache(int64_t(prompt.size()) + 64);
    GenerateOptions go;
    go.max_tokens = 64;
    go.stop_on_eog = false;
    const GenerateResult r = e.generate(c, prompt, go);
    LlamaRef ref(*path_, k_threads, 512);
    EXPECT_EQ(r.tokens, ref.greedy(prompt, 64));
}

// kvlab's own kernel computes attention in float32 where ggml's rounds to F16 or sums in
// another order. The model quantizes every activation to 8 bits before each matmul
// (Q4_1 weights x Q8_1 activations), so a difference of one float ulp in an attention
// output flips some roundings and the flips compound over 30 layers: the two kernels
// cannot agree to 1e-2 on this model, and no kernel other than ggml's own can. The
// precision of the kernel is tested where no activation is quantized (test_tiny_archs:
// float32 weights, < 1e-3 from libllama) and against a plain reference
// (test_attention). Here: libllama's greedy path, teacher-forced through kvlab, agrees on
// the next token at nearly every position, and the logits stay close.
TEST_F(RealModel, OwnKernelAgreesWithLibllama) {
    const auto toks = text_tokens(512);
    LlamaRef ref(*path_, k_threads, 1024);
    const auto d = test::compare_logits(kvlab_logits(toks, 512), ref.decode(toks, true), model_->hparams().n_vocab);
    std::printf("[ measure  ] attention=kvlab: max |dlogit| vs libllama %.3g, top-1 mismatches %lld/512\n", d.max_abs,
                static_cast<long long>(d.top1_mismatch));
    EXPECT_LE(d.top1_mismatch, 512 / 20);
    EXPECT_LT(d.max_abs, 3.0f);

    const auto prompt = tok_->chat({{"user", "Write a short story about a lighthouse keeper."}});
    LlamaRef gref(*path_, k_threads, 512);
    const auto path = gref.greedy(prompt, 64);
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), path.begin(), path.end() - 1);
    const auto ours = kvlab_logits(seq, 512);
    const int64_t n_vocab = model_->hparams().n_vocab;
    int agree = 0;
    for (size_t i = 0; i < path.size(); ++i) {
        const float * row = ours.data() + (prompt.size() - 1 + i) * n_vocab;
        agree += int32_t(std::max_element(row, row + n_vocab) - row) == path[i];
    }
    std::printf("[ measure  ] attention=kvlab: next token = libllama's greedy token at %d/64 positions\n", agree);
    EXPECT_GE(agree, 58);
}

TEST_F(RealModel, ChunkSizesGiveTheSameLogits) {
    // kvlab's kernel: the result of a query row never depends on its chunk: bit-identical.
    const auto toks = text_tokens(512);
    const int64_t n_vocab = model_->hparams().n_vocab;
    const auto base = kvlab_logits(toks, 512);
    for (int chunk : {1, 7, 64, 100}) {
        const auto d = test::compare_logits(kvlab_logits(toks, chunk), base, n_vocab);
        EXPECT_EQ(d.max_abs, 0.0f) << "chunk " << chunk;
        EXPECT_EQ(d.top1_mismatch, 0) << "chunk " << chunk;
    }
    // ggml's flash attention from its 64-row tile up is row-independent as well.
    const auto base_ggml = kvlab_logits(toks, 512, AttentionKernel::ggml);
    const auto d = test::compare_logits(kvlab_logits(toks, 128, AttentionKernel::ggml), base_ggml, n_vocab);
    EXPECT_EQ(d.max_abs, 0.0f) << "attention=ggml, chunk 128";
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
