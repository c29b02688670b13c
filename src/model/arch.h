// The architecture plug-in seam: one file per architecture registers an
// Architecture; the shared decoder (decoder.cpp) builds the graph from the
// weights it loaded.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/model.h"

struct ggml_cgraph;

namespace kvlab {

// Looks tensors up by GGUF name in a loaded model; throws for a missing required one.
class TensorLookup {
public:
    TensorLookup(ggml_context * ctx, const std::string & model_path) : ctx_(ctx), path_(model_path) {}
    ggml_tensor * required(const std::string & name) const;
    ggml_tensor * optional(const std::string & name) const;
    ggml_tensor * required_layer(int il, const std::string & suffix) const;
    ggml_tensor * optional_layer(int il, const std::string & suffix) const;

private:
    ggml_context * ctx_;
    std::string path_;
};

// Attention over the KV store for layer il, supplied by the engine.
// q: F32 [head_dim, n_head, n_tokens] (post-RoPE); k, v: F32 [head_dim, n_head_kv, n_tokens]
// (k post-RoPE). Returns F32 [n_head*head_dim, n_tokens].
using AttentionFn = std::function<ggml_tensor *(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v)>;

struct GraphInputs {
    ggml_tensor * tokens = nullptr;   // I32 [n_tokens]
    ggml_tensor * pos = nullptr;      // I32 [n_tokens]
    ggml_tensor * out_ids = nullptr;  // I32 [n_out]: rows whose logits are computed
};

class Architecture {
public:
    virtual ~Architecture() = default;
    virtual std::string name() const = 0;
    // Fills what differs per architecture (RoPE mode, defaults); the common keys are read before.
    virtual void load_hparams(const gguf_context * gguf, HParams & hp) const = 0;
    // Looks up layer il's tensors; the default takes the llama layout with optional biases.
    virtual void load_layer(const TensorLookup & t, int il, LayerWeights & lw) const;
};

// Builds the decoder graph (embeddings, layers, output norm, lm head) into gf and returns
// F32 logits [n_vocab, n_out].
ggml_tensor * build_decoder(ggml_context * ctx, ggml_cgraph * gf, const Model & model, const GraphInputs & in,
                            const AttentionFn & attention);

void register_architecture(std::unique_ptr<Architecture> arch);
const Architecture * find_architecture(const std::string & name);
std::vector<std::string> architecture_names();

// Registers an architecture at static-initialisation time: `static ArchRegistrar<LlamaArch> reg;`
template <typename T>
struct ArchRegistrar {
    ArchRegistrar() { register_architecture(std::make_unique<T>()); }
};

}  // namespace kvlab
