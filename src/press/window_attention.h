// The observation window's attention weights, as the model computes them during the prefill:
// what Python scorers that ask for `attentions` get (python/src/scorer.cpp; kvpress's
// `attentions`, restricted to the last w queries). Computed from the captured queries
// (press/window_queries.h) and the cache's keys.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/model.h"

namespace kvlab::press {

// Layer il's attention weights of w window queries over its L rows: float32
// [n_head][w][L], query head g reading KV head g / n_gqa. Row r of the window is the query of
// the token at position pos[L - w + r] (the window is the context's last w tokens); it sees
// the rows at positions p <= its own and, on a sliding-window layer (hp.window(il) > 0), only
// those within the window (position - p < window), as the engine's mask; the others get
// exactly 0. The weights are softmax over the rows seen of q.k / sqrt(head_dim): the observed
// queries are scaled so that this is the model's own logit (QueryObserver; Gemma 3's
// query_pre_attn_scalar included; none of kvlab's architectures soft-caps attention logits).
// In double, rounded to float32 at the end.
//   q: [w][n_head][head_dim] (WindowQueries::layer); k: [n_head_kv][L][head_dim] (post-RoPE
//   keys); pos: [L], the rows' positions (the same for every head: a plain prefill).
// The heads are spread over n_threads threads.
std::vector<float> window_attention_weights(const HParams & hp, int il, const float * q, int64_t w, const float * k,
                                            const int32_t * pos, int64_t L, int n_threads);

}  // namespace kvlab::press
