// The attention of a batched evaluation (Engine::eval_batch), as the AttentionFn the architecture
// calls per layer: each sequence's new rows go into its own store, then one kernel node attends
// for every sequence over its own rows (kernels::attn::Batch), so a step costs the same nodes
// and barriers whatever the batch size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/store_attention.h"
#include "ggml.h"
#include "kernels/attention.h"
#include "kvlab/cache.h"

namespace kvlab {

class BatchAttention {
public:
    struct Sequence {
        const KvStore * cache = nullptr;
        std::vector<std::vector<int64_t>> n_past;  // [n_layer][n_head_kv] rows held before the call
        std::vector<int32_t> pos;                  // positions of its new tokens
        int64_t row0 = 0;                          // its first row in the batch
    };
    // The sequences' stores share their row types (the rotation of Q and of the output).
    BatchAttention(ggml_context * ctx, ggml_cgraph * gf, const HParams & hp, std::vector<Sequence> seqs,
                   kernels::GraphScratch & scratch);

    ggml_tensor * operator()(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v);
    void set_inputs() const;  // after the graph is allocated

private:
    ggml_context * ctx_;
    const HParams & hp_;
    kernels::GraphScratch & scratch_;
    std::vector<Sequence> seqs_;  // not resized after the stores are made (they hold its positions)
    std::vector<std::unique_ptr<StoreAttention>> stores_;
    std::vector<std::unique_ptr<kernels::attn::Batch>> batches_;  // one per layer
    int64_t rows_ = 0;
};

}  // namespace kvlab
