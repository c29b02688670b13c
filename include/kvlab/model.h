// A GGUF model loaded onto a ggml backend: hyper-parameters, weights, and the
// architecture plug-in that builds its graph.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct ggml_context;
struct ggml_tensor;
struct gguf_context;
struct ggml_backend;
struct ggml_backend_buffer;

namespace kvlab {

struct HParams {
    std::string arch;
    int32_t n_layer      = 0;
    int32_t n_embd       = 0;
    int32_t n_head       = 0;
    int32_t n_head_kv    = 0;
    int32_t head_dim     = 0;  // key and value head size (equal for supported archs)
    int32_t n_ff         = 0;
    int32_t n_vocab      = 0;
    int32_t n_ctx_train  = 0;
    float   rms_eps      = 1e-5f;
    int32_t n_rot        = 0;          // dims rotated by RoPE
    int32_t rope_mode    = 0;          // ggml rope mode: 0 normal (llama), 2 neox (qwen)
    float   rope_theta   = 10000.0f;
    float   rope_freq_scale = 1.0f;    // 1 / linear scaling factor
    std::string rope_scaling_type = "none";
    int32_t sliding_window = 0;        // 0: none
    int32_t n_gqa() const { return n_head / n_head_kv; }
};

struct LayerWeights {
    ggml_tensor * attn_norm = nullptr;  // F32 [n_embd]
    ggml_tensor * wq = nullptr;         // [n_embd, n_head*head_dim]
    ggml_tensor * wk = nullptr;         // [n_embd, n_head_kv*head_dim]
    ggml_tensor * wv = nullptr;         // [n_embd, n_head_kv*head_dim]
    ggml_tensor * wo = nullptr;         // [n_head*head_dim, n_embd]
    ggml_tensor * bq = nullptr;         // F32 [n_head*head_dim]     (qwen2)
    ggml_tensor * bk = nullptr;         // F32 [n_head_kv*head_dim]  (qwen2)
    ggml_tensor * bv = nullptr;         // F32 [n_head_kv*head_dim]  (qwen2)
    ggml_tensor * q_norm = nullptr;     // F32 [head_dim]            (qwen3)
    ggml_tensor * k_norm = nullptr;     // F32 [head_dim]            (qwen3)
    ggml_tensor * ffn_norm = nullptr;   // F32 [n_embd]
    ggml_tensor * ffn_gate = nullptr;   // [n_embd, n_ff]
    ggml_tensor * ffn_up = nullptr;     // [n_embd, n_ff]
    ggml_tensor * ffn_down = nullptr;   // [n_ff, n_embd]
};

struct Weights {
    ggml_tensor * tok_embd = nullptr;     // [n_embd, n_vocab]
    ggml_tensor * output_norm = nullptr;  // F32 [n_embd]
    ggml_tensor * output = nullptr;       // [n_embd, n_vocab] (== tok_embd when tied)
    ggml_tensor * rope_freqs = nullptr;   // F32 [n_rot/2] (llama 3 rope scaling), optional
    std::vector<LayerWeights> layers;
};

class Architecture;

class Model {
public:
    // Loads the GGUF at path (a file path; short names are resolved by the caller).
    // Throws kvlab::Error naming the problem for missing, non-GGUF, truncated or
    // unsupported files.
    static std::unique_ptr<Model> load(const std::string & path, int n_threads);
    ~Model();
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    const HParams & hparams() const { return hparams_; }
    const Weights & weights() const { return weights_; }
    const Architecture & arch() const { return *arch_; }
    const std::string & path() const { return path_; }
    const gguf_context * gguf() const { return gguf_; }
    ggml_backend * backend() const { return backend_; }
    int n_threads() const { return n_threads_; }
    void set_n_threads(int n_threads);
    uint64_t weight_bytes() const;
    double load_seconds() const { return load_seconds_; }
    std::string backend_name() const;

private:
    Model() = default;
    std::string path_;
    HParams hparams_;
    Weights weights_;
    const Architecture * arch_ = nullptr;
    gguf_context * gguf_ = nullptr;
    ggml_context * ctx_ = nullptr;            // tensor metadata of the weights
    ggml_backend * backend_ = nullptr;
    ggml_backend_buffer * buffer_ = nullptr;  // weight data
    int n_threads_ = 1;
    double load_seconds_ = 0.0;
};

}  // namespace kvlab
