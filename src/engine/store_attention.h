// The graph-store seam (Engine::eval): the attention of one evaluation over the KV store, as the
// AttentionFn the architecture calls per layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ggml.h"
#include "kernels/attention.h"
#include "kvlab/cache.h"
#include "kvlab/model.h"

namespace kvlab {

struct RowWrite;  // one layer's new rows for the quantizing write node (store_attention.cpp)

// The attention of one evaluation over the KV store, as the AttentionFn the architecture
// calls per layer: writes the layer's new K/V rows into its segments (right after the rows
// held before the call, n_past), then attends with ggml's flash attention (a layer whose
// heads hold the same rows, attention=ggml) or kvlab's kernel. Owns what the graph's
// computation reads: the masks and the kernel problems.
class StoreAttention {
public:
    StoreAttention(ggml_context * ctx, ggml_cgraph * gf, const HParams & hp, const KvStore & cache,
                   std::vector<std::vector<int64_t>> n_past, const std::vector<int32_t> & pos,
                   kernels::GraphScratch & scratch, bool use_ggml, bool observe_q, bool observe_x);
    ~StoreAttention();  // in store_attention.cpp, where RowWrite is complete

    ggml_tensor * operator()(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * x);

    // Uploads the masks and the Hadamard matrices (after the graph is allocated).
    void set_inputs() const;

    // Layer il's post-RoPE queries, F32 [head_dim, n_head, n] (graph outputs when observed).
    ggml_tensor * queries(int il) const { return q_seen_[il]; }
    // Layer il's hidden state entering the attention, F32 [n_embd, n] (graph outputs when observed).
    ggml_tensor * hidden(int il) const { return x_seen_[il]; }

    // The pieces operator() is made of, for a batch of stores (BatchAttention):
    // t's rows of n values times the n x n Hadamard matrix, as libllama's graph computes it: a
    // product tagged as a Hadamard matrix's, which ggml's CPU backend runs as a fast transform.
    ggml_tensor * hadamard(ggml_tensor * t, int32_t n);
    // The nodes that write layer il's new rows k, v (F32 [head_dim, n_head_kv, n]; rotated by H_kr,
    // H_vr where those are not 0) into the store.
    std::vector<ggml_tensor *> write(int il, ggml_tensor * k, ggml_tensor * v, int32_t kr, int32_t vr);
    // The kernel's problem of layer il over the store's rows (owned by this object).
    const kernels::attn::Problem * problem(int il);

private:
    int64_t n() const { return int64_t(pos_.size()); }

    // The new rows of a quantized or rotated cache, every head's K and V in one node (a decode step's
    // writes would otherwise be 2 x n_head_kv quantizing copies and two rotations per layer,
    // each a barrier): each row rotated by the same butterflies ggml's CPU transform runs
    // (hadamard_rows: the same operations per element, so the same bits), then quantized by
    // the CPU backend's own from_float, as libllama's cache writes are.
    std::vector<ggml_tensor *> write_quantized(int il, ggml_tensor * k, ggml_tensor * v, int32_t kr, int32_t vr);

    // The new rows go through ggml's copy, which rounds to F16 or quantizes each row with the
    // CPU backend's own quantizer (what libllama's cache writes run).
    std::vector<ggml_tensor *> write_rows(int il, ggml_tensor * k, ggml_tensor * v);

    // ggml's flash attention over the layer's block, with one causal mask per distinct
    // position set (layers that hold the same rows share it).
    ggml_tensor * flash(int il, ggml_tensor * q);

    // kvlab's kernel over every segment of the layer, after the writes of the new rows.
    ggml_tensor * kernel(int il, ggml_tensor * q, const std::vector<ggml_tensor *> & writes);

    ggml_context * ctx_;
    ggml_cgraph * gf_;
    const HParams & hp_;
    const KvStore & cache_;
    std::vector<std::vector<int64_t>> n_past_;  // [n_layer][n_head_kv] rows held before the call
    const std::vector<int32_t> & pos_;          // [n] positions of the new tokens
    kernels::GraphScratch & scratch_;           // the graph's, for kvlab's nodes
    bool use_ggml_;
    bool observe_q_, observe_x_;
    std::vector<ggml_tensor *> q_seen_, x_seen_;  // [n_layer]
    float scale_;
    size_t k_row_, v_row_;  // bytes of one K row and of one V row
    std::vector<std::pair<ggml_tensor *, std::vector<ggml_fp16_t>>> masks_;
    std::vector<std::pair<ggml_tensor *, std::vector<float>>> rotations_;  // Hadamard matrices by size
    std::vector<const std::vector<int32_t> *> mask_pos_;                   // the position set of each mask
    std::vector<int32_t> mask_window_;                                     // and its window (0: causal only)
    std::vector<std::unique_ptr<kernels::attn::Problem>> problems_;
    std::vector<std::unique_ptr<RowWrite>> writes_;
};

}  // namespace kvlab
