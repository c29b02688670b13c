// The tiny-model writer itself: its file loads in libllama and gives finite, varied
// logits; the same spec gives the same bytes; a bad spec throws kvlab::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "kvlab/error.h"
#include "llama-cpp.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

std::string file_bytes(const std::string & p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

TEST(TinyGguf, LlamaLoadsInLibllamaWithFiniteVariedLogits) {
    const std::string dir = test::temp_dir("tiny-gguf");
    test::TinySpec spec;
    spec.arch = "llama";
    const std::string path = test::write_tiny_gguf(spec, test::default_model_path(), dir + "/tiny.gguf");

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.progress_callback = [](float, void *) { return true; };  // no progress dots
    llama_model_ptr model(llama_model_load_from_file(path.c_str(), mp));
    ASSERT_NE(model, nullptr) << "libllama cannot load " << path;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 64;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context_ptr ctx(llama_init_from_model(model.get(), cp));
    ASSERT_NE(ctx, nullptr);

    const llama_vocab * vocab = llama_model_get_vocab(model.get());
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    ASSERT_GT(n_vocab, 1000);  // the real model's vocabulary
    std::vector<llama_token> toks(16);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = llama_token((i * 7919 + 11) % n_vocab);
    ASSERT_EQ(llama_decode(ctx.get(), llama_batch_get_one(toks.data(), int32_t(toks.size()))), 0);

    const float * logits = llama_get_logits_ith(ctx.get(), -1);
    ASSERT_NE(logits, nullptr);
    double sum = 0, sq = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i;
        sum += logits[i];
        sq += double(logits[i]) * logits[i];
    }
    const double mean = sum / n_vocab;
    const double sd = std::sqrt(std::max(0.0, sq / n_vocab - mean * mean));
    EXPECT_GT(sd, 0.1) << "logits are (nearly) all equal";
    EXPECT_LT(sd, 100.0) << "activations blew up";
    std::filesystem::remove_all(dir);
}

TEST(TinyGguf, SameSpecSameBytes) {
    const std::string dir = test::temp_dir("tiny-gguf-det");
    test::TinySpec spec;
    spec.arch = "qwen3";
    spec.head_dim = 32;
    spec.weight_type = GGML_TYPE_Q8_0;
    const std::string src = test::default_model_path();
    const std::string a = file_bytes(test::write_tiny_gguf(spec, src, dir + "/a.gguf"));
    const std::string b = file_bytes(test::write_tiny_gguf(spec, src, dir + "/b.gguf"));
    spec.seed = 2;
    const std::string c = file_bytes(test::write_tiny_gguf(spec, src, dir + "/c.gguf"));
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == b);
    EXPECT_TRUE(a.size() == c.size() && a != c);
    std::filesystem::remove_all(dir);
}

TEST(TinyGguf, BadSpecThrows) {
    const std::string dir = test::temp_dir("tiny-gguf-bad");
    test::TinySpec spec;
    spec.arch = "qwen2";
    spec.head_dim = 32;  // qwen2 needs n_head * head_dim == n_embd
    EXPECT_THROW(test::write_tiny_gguf(spec, test::default_model_path(), dir + "/x.gguf"), Error);
    spec.arch = "mamba";
    EXPECT_THROW(test::write_tiny_gguf(spec, test::default_model_path(), dir + "/x.gguf"), Error);
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvlab
