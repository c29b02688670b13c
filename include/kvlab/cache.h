// The KV store: per layer, per KV head, a segment of K and V rows (post-RoPE keys)
// with its own length and the ORIGINAL position of every row. Layers may differ in
// capacity; heads keep their own lengths (filled uniformly by prefill; compression
// makes them differ).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvlab/model.h"

struct ggml_backend_buffer;

namespace kvlab {

class KvStore {
public:
    // capacity: rows per (layer, head) segment, the same for every layer.
    KvStore(const HParams & hp, ggml_backend * backend, int64_t capacity);
    // per-layer capacities (compression allocates exactly kept + reserve rows per layer).
    KvStore(const HParams & hp, ggml_backend * backend, const std::vector<int64_t> & capacities);
    ~KvStore();
    KvStore(KvStore && other) noexcept;
    KvStore & operator=(KvStore && other) noexcept;
    KvStore(const KvStore &) = delete;
    KvStore & operator=(const KvStore &) = delete;

    // A deep, independent copy: same capacities, same rows and positions.
    KvStore copy() const;

    int32_t n_layer() const { return int32_t(layers_.size()); }
    int32_t n_head_kv() const { return n_head_kv_; }
    int32_t head_dim() const { return head_dim_; }
    int64_t capacity(int il) const { return layers_[il].capacity; }
    int64_t n_rows(int il, int h) const { return int64_t(layers_[il].pos[h].size()); }
    int64_t max_rows(int il) const;
    // Original positions of the rows of (layer, head), in row order.
    const std::vector<int32_t> & positions(int il, int h) const { return layers_[il].pos[h]; }
    // True when every (layer, head) holds the same positions (the uniform fast path).
    bool uniform() const;
    // Absolute position the next appended token takes (never the compressed length).
    int32_t next_pos() const { return next_pos_; }
    // Number of prompt/answer tokens ever appended.
    int64_t n_tokens_seen() const { return next_pos_; }

    ggml_tensor * k(int il) const { return layers_[il].k; }  // F16 [head_dim, capacity, n_head_kv]
    ggml_tensor * v(int il) const { return layers_[il].v; }  // F16 [head_dim, capacity, n_head_kv]

    // Makes room for n more rows in every segment, growing (reallocating and copying)
    // when needed; growth keeps the rows and doubles-or-fits capacity.
    void reserve(int64_t n_more);
    // Records that the graph wrote n rows at the end of every segment, at positions
    // next_pos() .. next_pos()+n-1.
    void commit(int64_t n);

    // Allocated bytes of the K/V buffers, and the bytes the held rows need.
    uint64_t bytes() const;
    uint64_t used_bytes() const;
    uint64_t row_bytes() const;  // K + V bytes of one row of one head

private:
    struct Layer {
        ggml_tensor * k = nullptr;  // F16 [head_dim, capacity, n_head_kv]
        ggml_tensor * v = nullptr;  // F16 [head_dim, capacity, n_head_kv]
        int64_t capacity = 0;
        std::vector<std::vector<int32_t>> pos;  // [n_head_kv][n_rows]
    };
    void allocate(const std::vector<int64_t> & capacities);
    void release();

    HParams hp_;
    ggml_backend * backend_ = nullptr;
    int32_t n_head_kv_ = 0;
    int32_t head_dim_ = 0;
    int32_t next_pos_ = 0;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer * buffer_ = nullptr;
    std::vector<Layer> layers_;
};

}  // namespace kvlab
