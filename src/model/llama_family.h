// The llama family, the default composition of the shared builders: pre-norm decoder
// blocks (RMS norm, grouped-query attention with RoPE, gated SiLU FFN), a final RMS norm
// and an LM head, tied to the token embeddings when output.weight is absent. llama, qwen2
// and qwen3 are this family with options; an architecture that differs elsewhere writes
// its own Architecture from graph_builders.h.
#pragma once

#include <memory>

#include "model/arch.h"

namespace kvlab {

struct LlamaOptions {
    int32_t rope_mode = GGML_ROPE_TYPE_NORMAL;  // GGML_ROPE_TYPE_NORMAL or GGML_ROPE_TYPE_NEOX
    bool qkv_bias = false;                      // Q, K and V biases required (without: used when the file has them)
    bool qk_norm = false;                       // per-head RMS norms of Q and K before RoPE, required
};

std::unique_ptr<Architecture> make_llama_family(const LlamaOptions & opts);

}  // namespace kvlab
