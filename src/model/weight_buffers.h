// Where a model's weights live: the matrices the graph multiplies go to the CPU backend's
// extra buffer types (ggml's repacked layouts, e.g. q4_K_8x8, with faster GEMM kernels; the
// buffer types libllama uses) when one supports them; everything else to a plain host buffer.
#pragma once

#include <functional>

#include "ggml-cpp.h"

namespace kvlab {

struct WeightBuffers {
    ggml_backend_buffer_ptr repacked;  // null when no tensor went there
    ggml_backend_buffer_ptr plain;
    int n_repacked = 0;
};

// Allocates every tensor of ctx. `may_repack` says which tensors are only ever the weight
// of a matrix product (never read on the host, never gathered by rows); those an extra
// buffer type supports are placed there, when `repack`.
WeightBuffers allocate_weights(ggml_context * ctx, ggml_backend_t backend, bool repack,
                               const std::function<bool(const ggml_tensor *)> & may_repack);

}  // namespace kvlab
