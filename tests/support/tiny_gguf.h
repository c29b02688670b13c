// Tiny random-weight GGUF models for architecture tests (docs/design.md, "Style": a few layers, small
// dims, seeded weights, compared across engines). The vocabulary and chat template come
// from a real model so that tokenization matches; only the weights are random.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml.h"
#include "kvlab/model.h"
#include "kvlab/press.h"

namespace kvlab::test {

struct TinySpec {
    std::string arch;  // a row of the layout table in tiny_gguf.cpp: "llama" | "qwen2" | "qwen3" | "gemma3"
    int n_layer = 2;
    int n_embd = 64;
    int n_head = 4;
    int n_head_kv = 2;
    int head_dim = 16;  // qwen2 needs n_head * head_dim == n_embd; llama and qwen3 do not
    int n_ff = 128;
    int n_ctx_train = 2048;
    float rope_theta = 10000.f;
    int sliding_window = 0;  // > 0: <arch>.attention.sliding_window (gemma3: every 6th layer stays global)
    float rms_eps = 1e-5f;
    uint64_t seed = 1;
    bool tie_embeddings = true;             // no output.weight: the LM head is token_embd
    ggml_type weight_type = GGML_TYPE_F32;  // 2-D matrices: F32, F16 or Q8_0; norms and biases stay F32
    // 0: the source's whole vocabulary; else its first vocab_size tokens (with their types and
    // the merges among them), a file of a few KiB for fuzzing seeds
    int vocab_size = 0;
};

// Writes a GGUF at out_path with every tokenizer.* key of vocab_src (the real default
// model), spec's hyperparameters and weights drawn from std::mt19937_64(spec.seed):
// matrices N(0, 1/n_in) so each matmul keeps activations O(1) (std 0.125 at n_in = 64,
// ~0.02 at real widths), norms 1 + N(0, 0.05^2), biases N(0, 0.05^2). The same spec
// gives the same bytes on every run. Returns out_path; throws kvlab::Error("tiny_gguf", ...).
std::string write_tiny_gguf(const TinySpec & spec, const std::string & vocab_src, const std::string & out_path);

// The real default model: env KVLAB_TEST_MODEL if set, else
// ~/.cache/kvlab/models/smollm2-135m-0.1.2.gguf. Throws kvlab::Error naming the fix
// (scripts/models.sh smollm2-135m) when the file is missing.
std::string default_model_path();

// The parameters a method needs on `model` beyond its defaults: kvzap's scorer (a seeded random
// linear surrogate of the model's shape, bound to its sha256, written into dir once); {} for the
// others.
kvlab::ParamMap method_test_params(const std::string & method, const kvlab::Model & model, const std::string & dir);

// A tiny model of `spec` written into a fresh temporary directory and loaded (2 threads),
// with the first n_tokens ids of tests/data/avg.txt in its vocabulary. The directory goes
// with it.
struct TinyModel {
    std::string dir;
    std::unique_ptr<kvlab::Model> model;
    std::vector<int32_t> tokens;
    ~TinyModel();
};
std::unique_ptr<TinyModel> load_tiny_model(const TinySpec & spec, const std::string & tag, size_t n_tokens);

}  // namespace kvlab::test
