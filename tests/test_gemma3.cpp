// Gemma 3: sliding-window layers next to global ones. A tiny random gemma3 (6 layers: 5
// sliding, 1 global; float32 weights) against libllama at every position of contexts far
// longer than its window, the KV memory a sliding layer holds at any length, answers from
// compressed caches equal whatever the batch, every method on such a model; and the real
// gemma3-270m against libllama.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "app/fetch.h"
#include "environment.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/registry.h"
#include "kvlab/session.h"
#include "kvlab/text.h"
#include "llama_ref.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

constexpr int k_window = 64;
// float32 weights, kvlab's kernel vs libllama's F16-rounding one: measured 1.8e-3 at 1,300
// tokens on an Intel Xeon (test_tiny_archs: 1.2e-3 at 96); attention=ggml gives exactly 0
constexpr float k_precise = 1e-2f;

// Q8_0 matrices by default: every product then quantizes its activations row by row, so a
// row's logits never depend on the batch (the bit-identity tests); float32 for the
// precision test against libllama.
test::TinySpec tiny_gemma3(ggml_type weights = GGML_TYPE_Q8_0) {
    test::TinySpec spec;
    spec.weight_type = weights;
    spec.arch = "gemma3";
    spec.n_layer = 6;  // layers 0-4 slide, layer 5 is global (the default pattern of 6)
    spec.n_embd = 64;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.head_dim = 32;
    spec.n_ctx_train = 9000;
    spec.sliding_window = k_window;
    spec.seed = 11;
    return spec;
}

// A long text in the tiny model's vocabulary: the bundled essays, concatenated.
std::vector<int32_t> long_tokens(const Tokenizer & tok, size_t n) {
    std::vector<std::filesystem::path> files;
    for (const auto & e : std::filesystem::directory_iterator(test::source_dir() + "/data/haystack"))
        if (e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto & path : files) {
        std::ifstream f(path);
        std::ostringstream o;
        o << f.rdbuf();
        text += o.str() + "\n\n";
    }
    std::vector<int32_t> t = tok.encode(text);
    EXPECT_GE(t.size(), n);
    t.resize(n);
    return t;
}

class TinyGemma3 : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        tiny_ = test::load_tiny_model(tiny_gemma3(), "tiny-gemma3", 16).release();
        tok_ = new Tokenizer(tiny_->model->path());
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete tiny_;
    }
    static const Model & model() { return *tiny_->model; }
    static inline test::TinyModel * tiny_ = nullptr;
    static inline Tokenizer * tok_ = nullptr;
};

TEST_F(TinyGemma3, LayerKindsAreRead) {
    const HParams & hp = model().hparams();
    EXPECT_EQ(hp.n_swa, k_window);
    for (int il = 0; il < hp.n_layer; ++il) EXPECT_EQ(hp.window(il), il == 5 ? 0 : k_window) << il;
    EXPECT_EQ(hp.rope_theta_of(0), 1000.0f);  // the tiny layout's rope.freq_base_swa
    EXPECT_EQ(hp.rope_theta_of(5), 10000.0f);
}

// 1,300 tokens: 20 windows, so that slide() frees rows (units of 512) during the prefill.
// Float32 weights: every position's logits within k_precise of libllama's (attention=kvlab)
// or equal to them (attention=ggml: the same kernel on the rows libllama's cache holds, the
// freed ones invisible to it too), greedy tokens equal.
TEST(TinyGemma3Precision, LogitsAtEveryPositionMatchLibllamaPastTheWindow) {
    constexpr size_t n = 1300;
    auto tiny = test::load_tiny_model(tiny_gemma3(GGML_TYPE_F32), "tiny-gemma3-f32", 16);
    const Model & model = *tiny->model;
    Tokenizer tok(model.path());
    const std::vector<int32_t> toks = long_tokens(tok, n);
    const int64_t n_vocab = model.hparams().n_vocab;
    LlamaRef ref(model.path(), 2, 2048, 100);
    const std::vector<float> theirs = ref.decode(toks, true);
    for (AttentionKernel kernel : {AttentionKernel::kvlab, AttentionKernel::ggml}) {
        Engine e(model, EngineOptions{100, kernel});
        KvStore cache = e.new_cache(16);
        std::vector<float> ours;
        e.prefill(cache, toks, nullptr, &ours);
        const auto d = test::compare_logits(ours, theirs, n_vocab);
        std::printf(
            "[ measure  ] tiny gemma3 f32, %zu tokens, chunk 100, attention=%s: max |dlogit| vs libllama %.3g\n", n,
            attention_kernel_name(kernel), d.max_abs);
        if (kernel == AttentionKernel::ggml)
            EXPECT_EQ(d.max_abs, 0.0f) << "the same kernel over the same rows as libllama's";
        else
            EXPECT_LT(d.max_abs, k_precise);
        EXPECT_EQ(d.top1_mismatch, 0) << attention_kernel_name(kernel);
        for (int il = 0; il < 5; ++il)
            EXPECT_LE(cache.n_rows(il, 0), k_window - 1 + KvStore::k_slide_rows - 1) << "sliding layer " << il;
        EXPECT_EQ(cache.n_rows(5, 0), int64_t(n)) << "the global layer holds everything";
    }
    // greedy generation after a context longer than the window
    const std::vector<int32_t> prompt(toks.begin(), toks.begin() + 700);
    GenerateOptions go;
    go.max_tokens = 24;
    go.stop_on_eog = false;
    Engine e(model, EngineOptions{512});
    KvStore g = e.new_cache(16);
    EXPECT_EQ(e.generate(g, prompt, go).tokens, ref.greedy(prompt, 24));
}

// The rows slide() frees change no logit: 1,300 tokens in chunks of 100 and of 1,300, and
// the last 20 one at a time, bit-identical.
TEST_F(TinyGemma3, FreeingRowsChangesNoLogitWhateverTheChunks) {
    constexpr size_t n = 1300;
    const std::vector<int32_t> toks = long_tokens(*tok_, n);
    const int64_t n_vocab = model().hparams().n_vocab;
    std::vector<float> by_chunk[2];
    int i = 0;
    for (int chunk : {100, 1300}) {
        Engine e(model(), EngineOptions{chunk});
        KvStore cache = e.new_cache(16);
        e.prefill(cache, toks, nullptr, &by_chunk[i++]);
    }
    EXPECT_TRUE(by_chunk[0] == by_chunk[1]);
    Engine e(model(), EngineOptions{512});
    KvStore cache = e.new_cache(16);
    e.prefill(cache, std::vector<int32_t>(toks.begin(), toks.end() - 20));
    for (size_t t = n - 20; t < n; ++t) {
        const std::vector<float> one = e.prefill(cache, {toks[t]});
        EXPECT_TRUE(std::equal(one.begin(), one.end(), by_chunk[0].begin() + int64_t(t) * n_vocab)) << t;
    }
}

// The bound: a sliding layer holds at most window - 1 + 511 rows (plus one batch while it is
// evaluated): its bytes are the same at 8,192 tokens as at 2,048 (and fewer at 1,024, where
// the context is shorter than the bound); a global layer grows.
TEST_F(TinyGemma3, SlidingLayersHoldTheSameBytesAt8kAsAt2k) {
    const std::vector<int32_t> toks = long_tokens(*tok_, 8192);
    Engine e(model(), EngineOptions{512});
    uint64_t sliding_bytes[3] = {0, 0, 0}, global_rows[3] = {0, 0, 0};
    int i = 0;
    for (size_t n : {size_t(1024), size_t(2048), size_t(8192)}) {
        KvStore cache = e.new_cache(16);
        e.prefill(cache, std::vector<int32_t>(toks.begin(), toks.begin() + int64_t(n)));
        uint64_t cap = 0;
        for (int il = 0; il < 5; ++il)
            for (int h = 0; h < cache.n_head_kv(); ++h) {
                EXPECT_LE(cache.capacity(il, h), cache.max_window_rows(il, 512));
                cap += uint64_t(cache.capacity(il, h));
            }
        sliding_bytes[i] = cap * cache.row_bytes();
        global_rows[i] = uint64_t(cache.n_rows(5, 0));
        EXPECT_EQ(cache.total_rows(), cache.full_rows(int64_t(n)));
        std::printf("[ measure  ] %zu tokens: sliding layers %llu bytes allocated, global layer %llu rows\n", n,
                    static_cast<unsigned long long>(sliding_bytes[i]), static_cast<unsigned long long>(global_rows[i]));
        ++i;
    }
    EXPECT_LT(sliding_bytes[0], sliding_bytes[1]);
    EXPECT_EQ(sliding_bytes[1], sliding_bytes[2]);
    EXPECT_EQ(global_rows[0], 1024u);
    EXPECT_EQ(global_rows[2], 8192u);
}

// Every method on a context of 1,300 tokens at ratio 0.5: the sliding layers keep their
// window (the rows their next query sees), the global layer is compressed, the reported
// ratio is the rows freed of the full cache's; with budget.sliding the sliding layers keep
// a subset of their window. Then a question from the compressed cache: its logits in one
// batch equal those one token at a time.
TEST_F(TinyGemma3, EveryMethodCompressesTheGlobalLayersAndAnswersTheSameInAnyBatch) {
    const std::vector<int32_t> context = long_tokens(*tok_, 1300);
    const std::vector<int32_t> query(context.begin() + 200, context.begin() + 230);
    Engine e(model(), EngineOptions{512});
    const std::string dir = test::temp_dir("gemma3-methods");
    for (const MethodInfo & m : press_methods()) {
        SCOPED_TRACE(m.name);
        ContextSession s(e, {{m.name, test::method_test_params(m.name, model(), dir)}}, SessionOptions{64, 16, tok_});
        s.prefill(context);
        const PreparedCache full = s.full();
        EXPECT_EQ(full.cache.total_rows(), full.cache.full_rows(1300));
        for (bool sliding : {false, true}) {
            Budget b = Budget::from_ratio(0.5);
            b.sliding = sliding;
            const PreparedCache p = s.compress(0, b);
            for (int il = 0; il < 5; ++il)
                for (int h = 0; h < p.cache.n_head_kv(); ++h) {
                    const auto & pos = p.cache.positions(il, h);
                    ASSERT_FALSE(!sliding && pos.empty());
                    if (!pos.empty()) EXPECT_GT(pos.front(), 1300 - k_window) << "layer " << il;
                    if (!sliding) EXPECT_EQ(int64_t(pos.size()), k_window - 1) << "layer " << il;
                }
            int64_t global = 0;
            for (int h = 0; h < p.cache.n_head_kv(); ++h) global += p.cache.n_rows(5, h);
            EXPECT_LT(global, 2 * 1300) << "the global layer is compressed";
            const double ratio = achieved_ratio(p.cache, 1300);
            EXPECT_DOUBLE_EQ(ratio, 1.0 - double(p.cache.total_rows()) / double(full.cache.full_rows(1300)));
            EXPECT_GT(ratio, 0.0);

            std::vector<float> batch, one_by_one;
            KvStore a = p.cache.copy();
            e.prefill(a, query, nullptr, &batch);
            Engine e1(model(), EngineOptions{1});
            KvStore c = p.cache.copy();
            e1.prefill(c, query, nullptr, &one_by_one);
            EXPECT_TRUE(batch == one_by_one) << "sliding=" << sliding;
        }
    }
    std::filesystem::remove_all(dir);
}

// A failed prefill rolled back past rows that slide() freed: the cache refuses to go on
// (its next query would miss rows) instead of answering wrong.
TEST_F(TinyGemma3, ARollbackPastFreedRowsIsRefused) {
    const std::vector<int32_t> toks = long_tokens(*tok_, 1300);
    Engine e(model(), EngineOptions{100});
    KvStore cache = e.new_cache(16);
    e.prefill(cache, std::vector<int32_t>(toks.begin(), toks.begin() + 600));
    QueryObserver obs;
    obs.first = 600;
    obs.on_queries = [](int, int64_t tok0, int64_t, const float *) {
        if (tok0 >= 600) throw std::runtime_error("observer failed");  // absolute position 1,200
    };
    EXPECT_THROW(e.prefill(cache, std::vector<int32_t>(toks.begin() + 600, toks.end()), nullptr, nullptr, &obs),
                 std::runtime_error);
    EXPECT_EQ(cache.next_pos(), 600);
    EXPECT_TRUE(cache.lost_rows());
    try {
        e.prefill(cache, {toks[600]});
        FAIL() << "a cache that lost rows was evaluated";
    } catch (const Error & err) {
        EXPECT_NE(std::string(err.what()).find("lost rows of its sliding-window layers"), std::string::npos);
    }
}

// The real gemma3-270m (Q4_K_M) against libllama, both without repacked weight layouts
// (libllama repacks matrices kvlab keeps plain: attn_output, the tied LM head's duplicate;
// with its default repacking the two differ by rounding noise that 18 layers amplify,
// measured max |dlogit| 2.7 at 512 tokens). With attention=ggml both then run the same
// kernels on the same weights and rows: the logits are bit-identical at 512 tokens (inside
// the window) and in the last 512 positions of 4,096 (8 windows, kvlab's sliding layers freeing
// rows). kvlab's own
// kernel is bounded as the default model's (test_engine_llama.cpp: quantized activations
// make any other attention kernel drift): it agrees on most positions' top-1.
TEST(RealGemma3, LogitsMatchLibllamaAt512And4096Tokens) {
    const std::string path = resolve_model("gemma3-270m", cli::environment().models);
    // ggml's arithmetic for its Q8_0 products, no repacked layouts
    auto model = Model::load(path, {.n_threads = 2, .products = Products::ggml, .repack = false});
    EXPECT_EQ(model->n_repacked(), 0);
    Tokenizer tok(path);
    const int64_t n_vocab = model->hparams().n_vocab;
    // the logits of the last 512 positions (all of them at 512 tokens): at 4,096 the first 3,584
    // tokens go in without logits, on both sides in the same 512-token chunks (a vocabulary of
    // 262,144 makes every position's logits 1 MiB: 4 GiB per side at 4,096)
    constexpr size_t k_tail = 512;
    for (size_t n : {size_t(512), size_t(4096)}) {
        const std::vector<int32_t> toks = long_tokens(tok, n);
        const std::vector<int32_t> head(toks.begin(), toks.end() - k_tail), tail(toks.end() - k_tail, toks.end());
        LlamaRef ref(path, 2, int(n) + 64, 512, /*repack=*/false);
        if (!head.empty()) ref.decode(head, false);
        const std::vector<float> theirs = ref.decode(tail, true);
        for (AttentionKernel kernel : {AttentionKernel::ggml, AttentionKernel::kvlab}) {
            Engine e(*model, EngineOptions{512, kernel});
            KvStore cache = e.new_cache(16);
            std::vector<float> ours;
            if (!head.empty()) e.prefill(cache, head);
            e.prefill(cache, tail, nullptr, &ours);
            const auto d = test::compare_logits(ours, theirs, n_vocab);
            std::printf(
                "[ measure  ] gemma3-270m %zu tokens attention=%s, the last %zu positions: max |dlogit| "
                "%.3g, top-1 mismatches %lld\n",
                n, attention_kernel_name(kernel), k_tail, d.max_abs, static_cast<long long>(d.top1_mismatch));
            if (kernel == AttentionKernel::ggml) {
                EXPECT_EQ(d.max_abs, 0.0f) << n << " tokens";
                EXPECT_EQ(d.top1_mismatch, 0) << n << " tokens";
            } else {  // measured on an Intel Xeon: 16/512 and 160/4096 positions; bound 2.5x
                EXPECT_LE(double(d.top1_mismatch), 0.1 * double(k_tail)) << n << " tokens";
            }
        }
    }
}

// kvlab's block-order products (AMX or VNNI) on gemma3-270m, whose projections mix Q5_0, Q8_0, Q4_K
// and Q6_K: every matrix that only products read (the K-quants included) packed into panels and
// run by kvlab's kernels, each product a few float ulps from ggml's (the K-quants also with other
// activation blocks: 32 values and an f16 scale where ggml's Q8_K has 256 and a float), compounded
// over 18 layers of 8-bit activations; with ggml's attention, against libllama at 512 tokens.
// Also without panels (repack off: the K-quants then run ggml's products, the rest the block order
// from the GGUF layout). Measured on an AMD EPYC (Zen 5, vnni, 2 threads): top-1 mismatches 21 of
// 512 positions (max |dlogit| 3.7) with the K-quants in panels, 12 (2.69) without. Bound: 10% of
// the positions (as the attention kernel's above), 2.4x the measured.
TEST(RealGemma3, BlockOrderProductsAgreeWithLibllama) {
    if (!amx_available() && !vnni_available()) GTEST_SKIP() << "no AMX-INT8 tiles nor AVX-512 VNNI on this CPU";
    const std::string path = resolve_model("gemma3-270m", cli::environment().models);
    const Products products = amx_available() ? Products::amx : Products::vnni;
    Tokenizer tok(path);
    const std::vector<int32_t> toks = long_tokens(tok, 512);
    LlamaRef ref(path, 2, 512 + 64, 512, /*repack=*/false);
    const std::vector<float> theirs = ref.decode(toks, true);
    // repack: the K-quants in panels (kvlab's kernels); not: no panels, the K-quants by ggml's
    for (bool repack : {true, false}) {
        auto model = Model::load(path, {.n_threads = 2, .products = products, .repack = repack});
        size_t kquants = 0;
        for (const ggml_tensor * t : model->panels()) kquants += t->type == GGML_TYPE_Q4_K || t->type == GGML_TYPE_Q6_K;
        if (repack) EXPECT_GT(kquants, 0u) << "the K-quant projections run from panels";
        Engine e(*model, EngineOptions{512, AttentionKernel::ggml});
        KvStore cache = e.new_cache(16);
        std::vector<float> ours;
        e.prefill(cache, toks, nullptr, &ours);
        const auto d = test::compare_logits(ours, theirs, model->hparams().n_vocab);
        std::printf(
            "[ measure  ] gemma3-270m 512 tokens products=%s repack=%d: %zu K-quant matrices in panels, "
            "max |dlogit| %.3g, top-1 mismatches %lld\n",
            products_name(products), int(repack), kquants, d.max_abs, static_cast<long long>(d.top1_mismatch));
        EXPECT_LE(double(d.top1_mismatch), 0.1 * 512.0) << "repack " << repack;
    }
}

}  // namespace
}  // namespace kvlab
