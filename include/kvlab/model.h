// A GGUF model loaded onto a ggml backend: the hyper-parameters the layers above need,
// and the architecture plug-in (src/model/arch.h) that owns the weights and builds the graph.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ggml-cpp.h"
#include "kvlab/kernels.h"

namespace kvlab {

// What the layers above the model use: the shapes of the attention and of the KV cache,
// the context and vocabulary sizes, and how the cached keys were rotated (methods that
// undo or redo RoPE). What only an architecture's graph needs (FFN width, norm epsilon,
// optional tensors) stays with the architecture.
struct HParams {
    std::string arch;
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;  // key and value head size (equal for supported archs)
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    // RoPE of the queries and cached keys (ggml_rope_ext's parameters)
    int32_t n_rot = 0;                       // dims rotated (== head_dim)
    int32_t rope_mode = 0;                   // ggml rope mode: 0 normal (llama), 2 neox (qwen)
    float rope_theta = 10000.0f;             // base frequency
    float rope_freq_scale = 1.0f;            // 1 / linear scaling factor
    std::string rope_scaling_type = "none";  // as the GGUF says: none, linear
    // Sliding-window attention (Gemma 3): on the layers flagged in swa_layers a query at
    // position p sees only the keys at positions p - n_swa < pos <= p (llama.cpp's
    // LLAMA_SWA_TYPE_STANDARD); their RoPE base is rope_theta_swa. n_swa 0: every layer global.
    int32_t n_swa = 0;
    std::vector<uint8_t> swa_layers;  // [n_layer] 1: sliding-window layer (empty when n_swa == 0)
    float rope_theta_swa = 10000.0f;
    // The scale the attention applies to Q.K; 0: 1/sqrt(head_dim). Gemma 3 scales Q in its
    // graph (as llama.cpp, so that ggml's attention gives libllama's bits) and sets 1.
    float attn_scale = 0.0f;
    int32_t n_gqa() const { return n_head / n_head_kv; }
    // The window of layer il (0: a global layer, it sees every earlier key).
    int32_t window(int il) const { return n_swa > 0 && swa_layers[size_t(il)] ? n_swa : 0; }
    bool has_sliding_layers() const { return n_swa > 0; }
    float rope_theta_of(int il) const { return window(il) > 0 ? rope_theta_swa : rope_theta; }
    float kq_scale() const;
};

class Architecture;

// How a model is loaded and computed; each model has its own (two in one process may differ).
struct ModelOptions {
    // 0: every CPU that other processes leave idle, looked at again every quarter second while
    // the model computes (kvlab/cpu_share.h); N > 0: N threads.
    int n_threads = 0;
    // The arithmetic of the Q4_1, Q5_0 and Q8_0 weight products of every graph built on this
    // model (kvlab/kernels.h; `--products`).
    Products products = default_products();
    // The weight matrices that ggml's CPU backend can hold in a repacked layout (its extra
    // buffer types, e.g. Q4_0 8x8) go there, as libllama places them (`--no-repack`: off).
    bool repack = true;
    // Where the file's sha256 is memoised (sha256_file_cached); "": hashed when first asked.
    std::string hash_cache_dir;
};

class Model {
public:
    // Loads the GGUF at path (a file path; short names are resolved by the caller).
    // Throws kvlab::Error naming the problem for missing, non-GGUF, truncated or
    // unsupported files, and for options out of range.
    static std::unique_ptr<Model> load(const std::string & path, const ModelOptions & opts = {});
    ~Model();
    Model(Model &&) noexcept;
    Model & operator=(Model &&) noexcept;

    const HParams & hparams() const { return hparams_; }
    // The plug-in that owns the weights and builds the graph (internal: src/model/arch.h).
    const Architecture & arch() const { return *arch_; }
    // The attention output projection of layer il (W_o): [n_head*head_dim, n_embd], any type; only a
    // product's weight (its data may be in a repacked layout or in panels: read it with file_data).
    const ggml_tensor * attn_output(int il) const;
    // A weight's bytes in the GGUF's own layout, read from the file (whatever layout the loaded
    // copy took). Throws kvlab::Error when the file cannot be read.
    std::vector<uint8_t> file_data(const ggml_tensor * t) const;
    // RoPE frequency factors F32 [n_rot/2] (Llama 3 scaling), or nullptr.
    const ggml_tensor * rope_freq_factors() const;

    const std::string & path() const { return path_; }
    // The file's sha256 (lower-case hex), computed on first use (memoised in hash_cache_dir).
    const std::string & file_sha256() const;
    // kvlab's cache directory it was loaded with (ModelOptions::hash_cache_dir: the sha256 memo,
    // trained KVzap scorers under scorers/); "" for none.
    const std::string & cache_dir() const { return hash_cache_dir_; }
    const gguf_context * gguf() const { return gguf_.get(); }
    ggml_backend * backend() const { return backend_.get(); }
    int n_threads() const;
    void set_n_threads(int n_threads);  // a fixed count from now on
    // With n_threads 0 at load: re-reads the machine's load when a quarter second has passed and sets
    // the backend's threads to the idle CPUs. Returns the threads the next computation uses.
    // The engine calls it before each graph.
    int refresh_threads() const;
    bool auto_threads() const;
    uint64_t weight_bytes() const;
    int n_repacked() const { return n_repacked_; }  // weight matrices in ggml's repacked layouts
    // The weight matrices packed into the block-order kernels' 16-row panels (`--products amx|vnni`
    // without `--no-repack`; kernels/products.h): only those kernels read them.
    const std::unordered_set<const ggml_tensor *> & panels() const { return panels_; }
    Products products() const { return products_; }
    double load_seconds() const { return load_seconds_; }
    std::string backend_name() const;

private:
    Model();
    std::string path_;
    HParams hparams_;
    gguf_context_ptr gguf_;
    ggml_context_ptr ctx_;  // tensor metadata of the weights
    ggml_backend_ptr backend_;
    ggml_backend_buffer_ptr repacked_;  // the products' weights in a repacked layout (may be null)
    ggml_backend_buffer_ptr buffer_;    // the other weights
    int n_repacked_ = 0;
    std::unordered_set<const ggml_tensor *> panels_;
    Products products_ = Products::ggml;
    std::string hash_cache_dir_;
    struct Sha;
    std::unique_ptr<Sha> sha_;            // computed once, on first use
    std::unique_ptr<Architecture> arch_;  // points into ctx_'s tensors
    struct Threads;
    std::unique_ptr<Threads> threads_;
    double load_seconds_ = 0.0;
};

}  // namespace kvlab
