// The reference engine: libllama on the same GGUF, used by the correctness tests and
// by `kvlab bench`. kvlab's engine never calls it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "llama-cpp.h"

namespace kvlab {

class LlamaRef {
public:
    // n_ctx: context size of the reference context; n_ubatch: tokens per graph (chunk);
    // repack: libllama's repacked weight layouts (its default; it repacks some matrices kvlab
    // keeps plain, e.g. attn_output and a tied LM head's duplicate); types: its K and V cache
    // types (llama_context_params type_k / type_v; flash attention is always on).
    LlamaRef(const std::string & path, int n_threads, int n_ctx, int n_ubatch = 512, bool repack = true,
             CacheTypes types = {});

    int32_t n_vocab() const;
    // Clears the reference cache.
    void reset();
    // Appends tokens; returns the logits of every appended token (row-major [n][n_vocab])
    // when all is set, else only of the last one.
    std::vector<float> decode(const std::vector<int32_t> & tokens, bool all);
    // Greedy continuation of prompt (cleared cache first): n tokens, no EOG stop.
    std::vector<int32_t> greedy(const std::vector<int32_t> & prompt, int n);
    // Seconds to prefill tokens into a cleared cache (synchronized).
    double time_prefill(const std::vector<int32_t> & tokens);
    // Seconds to decode n single tokens on top of the current cache (synchronized).
    double time_decode(int32_t first_token, int n);

private:
    llama_model_ptr model_;
    llama_context_ptr ctx_;  // freed before model_
    int32_t n_past_ = 0;
};

}  // namespace kvlab
