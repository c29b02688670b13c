// Every supported architecture on a tiny random-weight GGUF written by the test itself
// (a few layers, small dims, seeded weights, the default model's vocabulary), compared
// with libllama on the same file.
#include <gtest/gtest.h>

#include <filesystem>

#include "kvlab/engine.h"
#include "kvlab/text.h"
#include "llama_ref.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

// The weights are float32, so nothing is quantized between the attention kernels and
// their precision shows. libllama at ubatch 96 runs ggml's tiled float32 flash attention
// (below 64 rows it rounds Q and the V sums to F16, drifting by ~1e-2 on these models).
// kvlab's float32 kernel must stay within k_precise of it at any chunk size; with
// attention=ggml kvlab runs the very same kernel.
constexpr float k_precise = 1e-3f;
constexpr float k_logit_bound = 1e-2f;

struct ArchCase {
    const char * arch;
    int n_layer, n_embd, n_head, n_head_kv, head_dim;
};

class TinyArch : public ::testing::TestWithParam<ArchCase> {};

TEST_P(TinyArch, LogitsAndGreedyMatchLibllama) {
    const ArchCase c = GetParam();
    test::TinySpec spec;
    spec.arch = c.arch;
    spec.n_layer = c.n_layer;
    spec.n_embd = c.n_embd;
    spec.n_head = c.n_head;
    spec.n_head_kv = c.n_head_kv;
    spec.head_dim = c.head_dim;
    spec.seed = 42;
    spec.weight_type = GGML_TYPE_F32;
    const std::string dir = test::temp_dir(c.arch);
    const std::string path = test::write_tiny_gguf(spec, test::default_model_path(), dir + "/tiny.gguf");

    auto model = Model::load(path, 2);
    EXPECT_EQ(model->hparams().arch, c.arch);
    EXPECT_EQ(model->hparams().head_dim, c.head_dim);
    Tokenizer tok(path);
    auto toks = tok.encode(test::test_text("addiction.txt"));
    toks.resize(96);

    LlamaRef ref(path, 2, 256, 96);
    const auto theirs = ref.decode(toks, true);
    struct Run {
        AttentionKernel kernel;
        int chunk;
        float bound;
    };
    for (const Run & run : {Run{AttentionKernel::kvlab, 96, k_precise}, Run{AttentionKernel::kvlab, 5, k_precise},
                            Run{AttentionKernel::ggml, 96, k_logit_bound}}) {
        Engine e(*model, EngineOptions{run.chunk, run.kernel});
        KvStore cache = e.new_cache(96);
        std::vector<float> ours;
        e.prefill(cache, toks, nullptr, &ours);
        const auto d = test::compare_logits(ours, theirs, model->hparams().n_vocab);
        std::printf("[ measure  ] %s attention=%s chunk %d: max |dlogit| vs libllama %.3g\n", c.arch,
                    attention_kernel_name(run.kernel), run.chunk, d.max_abs);
        EXPECT_EQ(d.top1_mismatch, 0) << attention_kernel_name(run.kernel) << " chunk " << run.chunk;
        EXPECT_LT(d.max_abs, run.bound) << attention_kernel_name(run.kernel) << " chunk " << run.chunk;
    }

    std::vector<int32_t> prompt(toks.begin(), toks.begin() + 16);
    const auto ref_greedy = ref.greedy(prompt, 24);
    for (AttentionKernel kernel : {AttentionKernel::kvlab, AttentionKernel::ggml}) {
        Engine e(*model, EngineOptions{512, kernel});
        KvStore c2 = e.new_cache(48);
        GenerateOptions go;
        go.max_tokens = 24;
        go.stop_on_eog = false;
        EXPECT_EQ(e.generate(c2, prompt, go).tokens, ref_greedy) << attention_kernel_name(kernel);
    }
    std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyArch,
                         ::testing::Values(ArchCase{"llama", 2, 64, 4, 2, 16}, ArchCase{"qwen2", 3, 64, 4, 2, 16},
                                           ArchCase{"qwen3", 2, 64, 4, 2, 32}),
                         [](const auto & info) { return std::string(info.param.arch); });

}  // namespace
}  // namespace kvlab
