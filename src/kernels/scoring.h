// Scoring primitives of the compression methods (docs/methods.md) on plain float arrays, so
// that each is testable without a model. Row-major layouts are stated per function;
// "higher score = more worth keeping" everywhere.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlab::kernels {

// Observation-window attention of one KV head (SnapKV family, docs/methods.md steps 1-5).
//   q: post-RoPE queries of the last w prompt tokens: row r's group of query heads is
//      q[r * q_stride .. + group * d) ([group][d])
//   k: [L][d] post-RoPE keys of the L prompt tokens, in position order
// logits = q . k / sqrt(d) in fp32, causal only inside the bottom-right w x w block,
// softmax over all L keys, summed over the w rows, averaged over the group (GQA) before
// any pooling. Returns [L - w]: the scores of the keys before the window.
std::vector<float> window_attention(const float * q, int64_t q_stride, const float * k, int64_t L, int w, int group,
                                    int d);

// Pooling along the keys, stride 1, padding kernel/2, same length (docs/methods.md step 6):
// max-pool ignores the padding (pads with -inf); avg-pool divides by `kernel` everywhere
// (count_include_pad). kernel must be odd; kernel 1 returns the input.
enum class Pool { max, avg, none };
std::vector<float> pool1d(const std::vector<float> & x, int kernel, Pool pool);

// H2O: adds to col[j] the causal attention probabilities of n query rows to the keys
// they see, averaged over the group's query heads.
//   q: row r's group of query heads at q[r * q_stride .. + group * d); query row r sits at
//      position p0 + r and sees keys [0, p0 + r]
//   k: [n_keys][d] with n_keys >= p0 + n, key j at position j
void accumulate_column_sums(const float * q, int64_t q_stride, int64_t n, int64_t p0, const float * k, int group, int d,
                            float * col);

// TOVA: attention probabilities of one query (the last prompt token) to its L keys.
//   q: [d], k: [L][d]. Returns [L].
std::vector<float> last_query_attention(const float * q, const float * k, int64_t L, int d);

// KVzip: attention of n repeat-pass query rows to a restricted key set, max over the rows
// and the group's query heads, accumulated into best[0 .. n_fixed) (best[j] = max(best[j], p)).
//   q: row r's group of query heads at q[r * q_stride .. + group * d); row r is the repeat
//      pass's token r0 + r
//   k: [n_fixed + n_rep][d]: the fixed keys (sinks and the chunk's rows), every one
//      visible to every row, then the repeat pass's own keys, row r seeing [0, r0 + r]
// logits = q . k / sqrt(d) in fp32, softmax over the fixed keys and the visible repeat keys.
void restricted_max_attention(const float * q, int64_t q_stride, int64_t n, int64_t r0, const float * k,
                              int64_t n_fixed, int64_t n_rep, int group, int d, float * best);

// Keys [n][d] transposed to [d][n_pad] (zero keys past n), the layout of the tiled score
// kernel: made once and shared by every block of queries that scores against them.
struct TransposedKeys {
    TransposedKeys(const float * k, int64_t n, int d);
    std::vector<float> kt;
    int64_t n, n_pad;
    int d;
};
// restricted_max_attention on keys transposed once (kt.n == n_fixed + n_rep). KVzip+ (kvpress
// kvzip_plus_normalization): with row_weight [n] and key_weight [group][n_fixed] (either may be
// null: 1), each probability p(r, g, j) is multiplied by row_weight[r] * key_weight[g][j] before
// the max over the rows and the group (KVzip+: 1 / ||x_r||, ||W_o,g^T v_j||).
void restricted_max_attention(const float * q, int64_t q_stride, int64_t n, int64_t r0, const TransposedKeys & kt,
                              int64_t n_fixed, int64_t n_rep, int group, float * best,
                              const float * row_weight = nullptr, const float * key_weight = nullptr);

// Knorm: -||k_j||_2 for each of L keys [L][d].
std::vector<float> negative_key_norms(const float * k, int64_t L, int d);

// KeyDiff: -cos(k_j, m) where m = mean over j of k_j / ||k_j||.
std::vector<float> keydiff(const float * k, int64_t L, int d);

// ExpectedAttention for one KV head, given statistics of the future queries of each
// query head of its group: mean mu [group][d] and covariance sigma [group][d][d] (both
// already rotated to the future positions).
//   score_j = mean over the group of softmax_j(mu.k_j / sqrt(d) + k_j^T sigma k_j / (2d)),
//   times ||v_j||_2 when use_vnorm. k, v: [L][d]. The softmax runs over the keys
//   [n_sink, L) only (kvpress drops the sinks first: they would soak up its mass); the
//   sinks, always kept, score 0.
std::vector<float> expected_attention(const float * mu, const float * sigma, const float * k, const float * v,
                                      int64_t L, int64_t n_sink, int group, int d, bool use_covariance, bool use_vnorm);

// Top-n row indices of scores[0..n_rows) (higher first, ties to the lower index),
// returned ascending.
std::vector<int32_t> top_rows(const float * scores, int64_t n_rows, int64_t n);

}  // namespace kvlab::kernels
