// kvlab's engine against libllama on the real default model (SmolLM2-135M-Instruct Q4_1):
// with ggml's attention and ggml's product arithmetic, the same logits bit for bit at every
// position of a 512-token text and the same greedy generation; with kvlab's own kernel, and
// with kvlab's AMX products, agreement along libllama's greedy path (teacher-forced);
// chunk-size invariance; copies of a cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "app/fetch.h"
#include "environment.h"
#include "eval/metrics.h"
#include "ggml.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/registry.h"
#include "kvlab/text.h"
#include "llama_ref.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

constexpr int k_threads = 2;
constexpr int k_greedy = 64;  // tokens of libllama's greedy path

// The model, its tokenizer, and what several tests compare against, each computed once per
// process on first use (CTest runs every test in a process of its own; a plain run of
// kvlab_tests shares them).
class RealModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        path_ = new std::string(resolve_model("smollm2-135m", cli::environment().models));
        model_ = Model::load(*path_, {.n_threads = k_threads}).release();
        ggml_model_ = Model::load(*path_, {.n_threads = k_threads, .products = Products::ggml}).release();
        tok_ = new Tokenizer(*path_);
    }
    static void TearDownTestSuite() {
        delete greedy_;
        delete tok_;
        delete model_;
        delete ggml_model_;
        delete path_;
        greedy_ = nullptr;
    }
    static int64_t n_vocab() { return model_->hparams().n_vocab; }
    static std::vector<int32_t> text_tokens(size_t n) {
        std::vector<int32_t> t = tok_->encode(test::test_text("avg.txt"));
        EXPECT_GE(t.size(), n);
        t.resize(n);
        return t;
    }
    // On `model` (null: model_, the default products).
    static std::vector<float> kvlab_logits(const std::vector<int32_t> & toks, int chunk,
                                           AttentionKernel attn = AttentionKernel::kvlab, const Model * model = nullptr,
                                           CacheTypes types = {}) {
        EngineOptions eo{chunk, attn};
        eo.cache_types = types;
        Engine e(model ? *model : *model_, eo);
        KvStore c = e.new_cache(int64_t(toks.size()));
        std::vector<float> all;
        e.prefill(c, toks, nullptr, &all);
        return all;
    }
    static std::vector<int32_t> story_prompt() {
        return tok_->chat({{"user", "Write a short story about a lighthouse keeper."}});
    }
    // libllama's greedy continuation of the story prompt (k_greedy tokens, no EOG stop), as
    // LlamaRef::greedy makes it (prompt, then one token at a time), with the logits that
    // chose each token: logits row i predicts tokens[i].
    struct Greedy {
        std::vector<int32_t> tokens;
        std::vector<float> logits;  // [k_greedy][n_vocab]
    };
    static const Greedy & greedy_path() {
        if (!greedy_) {
            LlamaRef ref(*path_, k_threads, 512);
            greedy_ = new Greedy;
            std::vector<float> l = ref.decode(story_prompt(), false);
            for (int i = 0; i < k_greedy; ++i) {
                greedy_->logits.insert(greedy_->logits.end(), l.begin(), l.end());
                greedy_->tokens.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
                if (i + 1 < k_greedy) l = ref.decode({greedy_->tokens.back()}, false);
            }
        }
        return *greedy_;
    }
    // Teacher-forced along libllama's greedy path (the prompt and libllama's 64 greedy tokens
    // prefilled through kvlab): top-1 agreement = the fraction of the 64 positions where kvlab's
    // argmax is libllama's greedy token, and the mean KL(libllama || kvlab) of the next-token
    // distributions, libllama's being those it chose the tokens from. Printed as measured.
    struct Agreement {
        double top1, kl_mean;
    };
    static Agreement along_greedy_path(const Model & model, AttentionKernel attn, const char * what) {
        const auto prompt = story_prompt();
        const Greedy & g = greedy_path();
        std::vector<int32_t> seq = prompt;
        seq.insert(seq.end(), g.tokens.begin(), g.tokens.end() - 1);
        // the rows that predict tokens[0..63]: from the prompt's last token on
        const auto ours = rows(kvlab_logits(seq, 512, attn, &model), prompt.size() - 1, g.tokens.size());
        int agree = 0;
        for (size_t i = 0; i < g.tokens.size(); ++i) {
            const float * row = ours.data() + i * n_vocab();
            agree += int32_t(std::max_element(row, row + n_vocab()) - row) == g.tokens[i];
        }
        const double top1 = double(agree) / double(g.tokens.size());
        const eval::Fidelity f = eval::fidelity(g.logits, ours, n_vocab());
        std::printf(
            "[ measure  ] %s along libllama's greedy path: top-1 %d/%zu = %.3f, mean KL(libllama || kvlab) %.4g "
            "(max %.3g), max |dlogit| %.3g\n",
            what, agree, g.tokens.size(), top1, f.kl_mean, f.kl_max,
            test::compare_logits(ours, g.logits, n_vocab()).max_abs);
        return {top1, f.kl_mean};
    }
    // Rows [first, first + n) of row-major logits.
    static std::vector<float> rows(const std::vector<float> & all, size_t first, size_t n) {
        return {all.begin() + first * n_vocab(), all.begin() + (first + n) * n_vocab()};
    }
    static inline std::string * path_ = nullptr;
    static inline Model * model_ = nullptr;       // the default products (amx where the CPU has it)
    static inline Model * ggml_model_ = nullptr;  // ggml's product arithmetic
    static inline Tokenizer * tok_ = nullptr;
    static inline Greedy * greedy_ = nullptr;
};

// With attention=ggml both engines run the same ggml kernels on the same weights and
// threads: the logits are bit-identical (measured: max |dlogit| = 0 over 512 positions).
TEST_F(RealModel, LogitsMatchLibllamaAt512Positions) {
    const auto toks = text_tokens(512);
    const auto ours = kvlab_logits(toks, 512, AttentionKernel::ggml, ggml_model_);
    LlamaRef ref(*path_, k_threads, 1024);
    const auto d = test::compare_logits(ours, ref.decode(toks, true), n_vocab());
    EXPECT_EQ(d.max_abs, 0.0f) << "attention=ggml differs from libllama";
    EXPECT_EQ(d.top1_mismatch, 0) << "first top-1 mismatch at position " << d.first_mismatch;
}

// Quantized K/V rows: libllama with the same type_k / type_v (and flash attention) rotates Q, K
// and V by a Walsh-Hadamard transform (head_dim 64 here), quantizes each new row with the CPU
// backend's quantizer and runs the same flash attention over the blocks: kvlab's logits are
// libllama's to the bit (measured: max |dlogit| = 0 over 512 positions, q8_0/q8_0 and
// q4_0/q4_0; without the rotation they differed by up to 16.6).
TEST_F(RealModel, QuantizedCacheLogitsMatchLibllama) {
    const auto toks = text_tokens(512);
    for (const CacheTypes types :
         {CacheTypes{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0}, CacheTypes{GGML_TYPE_Q4_0, GGML_TYPE_Q4_0}}) {
        SCOPED_TRACE(std::string("K ") + cache_type_name(types.k) + ", V " + cache_type_name(types.v));
        const auto ours = kvlab_logits(toks, 512, AttentionKernel::ggml, ggml_model_, types);
        LlamaRef ref(*path_, k_threads, 1024, 512, true, types);
        const auto d = test::compare_logits(ours, ref.decode(toks, true), n_vocab());
        EXPECT_EQ(d.max_abs, 0.0f) << "attention=ggml differs from libllama";
        EXPECT_EQ(d.top1_mismatch, 0) << "first top-1 mismatch at position " << d.first_mismatch;
    }
}

// kvlab's kernel over quantized rows keeps its guarantee: a row's logits do not depend on the
// chunk it was prefilled in (the rows are quantized one by one, and read as exact floats).
TEST_F(RealModel, QuantizedRowsGiveTheSameLogitsInEveryChunkSize) {
    constexpr size_t n = 150;
    const auto toks = text_tokens(n);
    const CacheTypes types{GGML_TYPE_Q8_0, GGML_TYPE_Q4_0};
    const auto base = kvlab_logits(toks, int(n), AttentionKernel::kvlab, nullptr, types);
    EXPECT_GT(test::compare_logits(base, kvlab_logits(toks, int(n)), n_vocab()).max_abs, 0.0f)
        << "quantized rows give other logits than F16 rows";
    for (const auto & [chunk, len] : {std::pair<int, size_t>{1, 40}, {7, 100}, {64, n}}) {
        const std::vector<int32_t> prefix(toks.begin(), toks.begin() + len);
        const auto d = test::compare_logits(kvlab_logits(prefix, chunk, AttentionKernel::kvlab, nullptr, types),
                                            rows(base, 0, len), n_vocab());
        EXPECT_EQ(d.max_abs, 0.0f) << "chunk " << chunk;
    }
}

TEST_F(RealModel, Greedy64TokensMatchLibllama) {
    const auto prompt = story_prompt();
    Engine e(*ggml_model_, EngineOptions{512, AttentionKernel::ggml});
    KvStore c = e.new_cache(int64_t(prompt.size()) + k_greedy);
    GenerateOptions go;
    go.max_tokens = k_greedy;
    go.stop_on_eog = false;
    EXPECT_EQ(e.generate(c, prompt, go).tokens, greedy_path().tokens);
}

// kvlab's own kernel computes attention in float32 where ggml's rounds to F16 or sums in
// another order. The model quantizes every activation to 8 bits before each matmul
// (Q4_1 weights x Q8_1 activations), so a difference of one float ulp in an attention
// output flips some roundings and the flips compound over 30 layers: the two kernels
// cannot agree to 1e-2 on this model, and no kernel other than ggml's own can. The
// precision of the kernel is tested where no activation is quantized (test_tiny_archs:
// float32 weights, < 1e-3 from libllama) and against a plain reference (test_attention).
//
// Here, with ggml's products, teacher-forced along libllama's greedy path (along_greedy_path).
// Measured on an "Intel(R) Xeon(R) Processor" (/proc/cpuinfo; AVX-512, 2 threads): top-1
// 61/64 = 0.953, mean KL 0.00367 (max 0.0145; max |dlogit| 1.35). Another CPU gave 58/64 =
// 0.906 for the same top-1 statistic, a noticeably worse tail, so the bounds leave a
// generous margin over this CPU's values: top-1 >= measured - 0.1 (55/64) and mean KL <=
// 3 x measured. The test prints both statistics: state them when a bound is revised.
TEST_F(RealModel, OwnKernelAgreesWithLibllamaAlongItsGreedyPath) {
    constexpr double k_top1_measured = 61.0 / 64.0, k_kl_measured = 0.00367;
    const Agreement a = along_greedy_path(*ggml_model_, AttentionKernel::kvlab, "attention=kvlab");
    EXPECT_GE(a.top1, k_top1_measured - 0.1);
    EXPECT_LE(a.kl_mean, 3.0 * k_kl_measured);
}

// kvlab's block-order products (kernels/product_amx.cpp: AMX tiles, or VNNI with the same bits) with
// ggml's attention: every product a few float ulps from ggml's, compounded over 30 layers of 8-bit
// activations as above. Measured on an "Intel(R) Xeon(R) Processor" (Sapphire Rapids, 2 threads,
// amx): top-1 60/64 = 0.938, mean KL 0.00357 (max 0.0156; max |dlogit| 1.44); the same margins.
// CPUs with AMX-INT8 or AVX-512 VNNI + BITALG run it.
TEST_F(RealModel, BlockOrderProductsAgreeWithLibllamaAlongItsGreedyPath) {
    constexpr double k_top1_measured = 60.0 / 64.0, k_kl_measured = 0.00357;
    if (!amx_available() && !vnni_available()) GTEST_SKIP() << "no AMX-INT8 tiles nor AVX-512 VNNI on this CPU";
    const Products products = amx_available() ? Products::amx : Products::vnni;
    const auto block_model = Model::load(*path_, {.n_threads = k_threads, .products = products});
    const std::string what = std::string("products=") + products_name(products) + ", attention=ggml";
    const Agreement a = along_greedy_path(*block_model, AttentionKernel::ggml, what.c_str());
    EXPECT_GE(a.top1, k_top1_measured - 0.1);
    EXPECT_LE(a.kl_mean, 3.0 * k_kl_measured);
}

// The products' arithmetic is the model's option, not the process's: two models of one file in one
// process, one with ggml's arithmetic and one with kvlab's block order, each give their own
// logits whatever the other computed in between (ggml's: libllama's bits, the test above), and
// each says which it ran in its provenance. Where the CPU has neither AMX nor VNNI both are
// ggml's: the same bits.
TEST_F(RealModel, EachModelKeepsItsOwnProducts) {
    const auto toks = text_tokens(64);
    const auto ggml_before = kvlab_logits(toks, 64, AttentionKernel::kvlab, ggml_model_);
    const auto other = Model::load(*path_, {.n_threads = k_threads, .products = default_products()});
    const auto theirs = kvlab_logits(toks, 64, AttentionKernel::kvlab, other.get());
    const auto ggml_after = kvlab_logits(toks, 64, AttentionKernel::kvlab, ggml_model_);
    EXPECT_EQ(test::compare_logits(ggml_after, ggml_before, n_vocab()).max_abs, 0.0f);
    EXPECT_EQ(provenance(*ggml_model_, *tok_)["machine"]["products"], "ggml");
    EXPECT_EQ(provenance(*other, *tok_)["machine"]["products"], products_name(default_products()));
    const float d = test::compare_logits(theirs, ggml_before, n_vocab()).max_abs;
    if (default_products() != Products::ggml)
        EXPECT_GT(d, 0.0f) << "the block order rounds differently from ggml's";
    else
        EXPECT_EQ(d, 0.0f);
}

// kvlab's kernel: the result of a query row never depends on its chunk: bit-identical. A
// row depends only on the tokens up to it, so each chunk size runs on a prefix of one text
// and is compared with the same rows of a single whole-text prefill: chunk 1 (decode steps)
// on 48 tokens, 7 on 120, 64 and 100 on all 200 (partial last chunks; the kernel's 16-row
// query tiles and 64-row key blocks cut at other places than the chunks).
TEST_F(RealModel, ChunkSizesGiveTheSameLogits) {
    constexpr size_t n = 200;
    const auto toks = text_tokens(n);
    const auto base = kvlab_logits(toks, int(n));
    for (const auto & [chunk, len] : {std::pair<int, size_t>{1, 48}, {7, 120}, {64, n}, {100, n}}) {
        const std::vector<int32_t> prefix(toks.begin(), toks.begin() + len);
        const auto d = test::compare_logits(kvlab_logits(prefix, chunk), rows(base, 0, len), n_vocab());
        EXPECT_EQ(d.max_abs, 0.0f) << "chunk " << chunk;
        EXPECT_EQ(d.top1_mismatch, 0) << "chunk " << chunk;
    }
    // ggml's flash attention from its 64-row tile up is row-independent as well.
    const auto d = test::compare_logits(kvlab_logits(toks, 128, AttentionKernel::ggml),
                                        kvlab_logits(toks, int(n), AttentionKernel::ggml), n_vocab());
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
