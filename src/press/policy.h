// Budget policies (docs/methods.md): how many rows each layer and KV head keeps, and which.
#pragma once

#include <cstdint>
#include <vector>

#include "press/method.h"

namespace kvlab::press {

// Throws when the budget cannot hold the rows the method always keeps.
void check_budget(const Scores & s, int64_t B);

// Every head of layer il keeps its forced rows plus its top (B[il] - forced) rows by its
// own scores (the shared top when s.per_layer). B[il] >= L keeps everything.
KeepPlan select_per_layer_budget(const Scores & s, const std::vector<int64_t> & B);

// Each (layer, head) keeps its forced rows plus its top n[il][h] candidate rows.
KeepPlan select_per_head(const Scores & s, const std::vector<std::vector<int64_t>> & n);

// One threshold over the candidates of every (layer, head) of `layers` (scores comparable across
// layers and heads: KVzip's, KVzap's): each keeps its forced rows, and together they keep the top
// (B - forced) * n_head * |layers| candidates (ties to the lower layer, head, row); the other
// layers keep every row (compress() restricts the sliding-window layers).
KeepPlan select_global(const Scores & s, int64_t B, const std::vector<int> & layers);
// Each (layer, head) of `layers` keeps its forced rows and the candidates scoring at least t;
// the other layers keep every row.
KeepPlan select_threshold(const Scores & s, float t, const std::vector<int> & layers);

// The candidate (non-forced) rows and their scores for layer il, head h.
std::vector<int32_t> candidate_rows(const Scores & s);
std::vector<float> candidate_scores(const Scores & s, int il, int h);

// The kept rows of one head: forced rows plus the top n candidates by `scores` ([L]).
std::vector<int32_t> keep_rows(const Scores & s, const std::vector<float> & scores, int64_t n);

// PyramidKV's per-layer budgets (window included) for a context of L rows, budget B,
// window w, n_layer layers and beta (docs/methods.md; KVCache-Factory's floored step).
std::vector<int64_t> pyramid_budgets(int64_t L, int64_t B, int64_t w, int n_layer, int64_t beta);
// kvpress's PyramidKVPress.get_layer_budget, in its double arithmetic and Python's round
// (half to even): max_capacity_prompt = w + L keep (keep = 1 - cr), min = (mcp - w) / beta,
// max = 2 (mcp - w) - min, max clamped to L - w (min moved to keep the mean); layer l keeps
// round(max - l (max - min) / (n_layer - 1)), window included; when not L >= max >= min >= w,
// every layer keeps max(1, round(L keep)).
std::vector<int64_t> pyramid_budgets_kvpress(int64_t L, double keep, int64_t w, int n_layer, int64_t beta);

// Ada-KV: budgets of the layer's heads for their non-forced rows, b each on average.
// scores[h][j] over the candidate rows (forced rows excluded). The global top H*b over
// all heads gives n_h per head; b_h = round(n_h (1 - alpha) + floor(alpha b)); the total
// is then made exactly H*b by the same global ranking (adding the best unselected, or
// removing the worst selected above the floor(alpha b) safeguard). b_h <= rows.
std::vector<int64_t> adakv_head_budgets(const std::vector<std::vector<float>> & scores, int64_t b, double alpha);
// Ada-KV's policy: each layer's heads share the budget by the global ranking of their candidates'
// scores, with the safeguard alpha (adakv_head_budgets; kvpress: adakv_head_budgets_kvpress with
// kvpress's safe count), then each head keeps its forced rows and its top b_h.
Policy adakv_policy(double alpha, bool kvpress);

// kvpress's AdaKVPress on the same candidates: each head first keeps its top `safe` rows,
// then the layer's other H*b - H*safe kept rows are the global top of the rest (ties: lower
// head, then lower row). b and safe count candidates (kvpress's n_kept and
// max(1, int(alpha n_kept)) less the forced rows, which its padded scores put first).
std::vector<int64_t> adakv_head_budgets_kvpress(const std::vector<std::vector<float>> & scores, int64_t b,
                                                int64_t safe);

}  // namespace kvlab::press
