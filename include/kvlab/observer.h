// The seam between the engine and the compression methods that score the cache from
// attention: the engine hands each prefilled chunk's post-RoPE queries to an observer.
// Lives in the cache layer (below the engine and the methods, siblings), so neither depends on the other.
#pragma once

#include <cstdint>
#include <functional>

namespace kvlab {

// Receives the post-RoPE queries (and, if asked, the hidden states entering each layer's
// attention) of prefilled tokens, chunk by chunk. Called after each chunk is computed, when
// the cache already holds that chunk's keys.
struct QueryObserver {
    int64_t first = 0;  // first token (0-based in the prefill call) whose queries are wanted
    // q: F32 [n][n_head][head_dim] of layer il for tokens [tok0, tok0 + n) of the call,
    // scaled so that q.k / sqrt(head_dim) is the attention's logit on every model (Gemma 3
    // scales its queries in the graph, as llama.cpp does: the engine undoes that here).
    std::function<void(int il, int64_t tok0, int64_t n, const float * q)> on_queries;
    // x: F32 [n][n_embd], the hidden state entering layer il's attention (after the layer's
    // input norm: what the Q/K/V projections read) for the same tokens; called before the
    // layer's on_queries. Either callback may be empty.
    std::function<void(int il, int64_t tok0, int64_t n, const float * x)> on_hidden;
};

}  // namespace kvlab
