// The KV store: per layer, per KV head, a segment of K and V rows (post-RoPE keys)
// with its own length, its own capacity and the ORIGINAL position of every row.
// Layers may differ (PyramidKV) and heads may differ (Ada-KV): compaction keeps only
// the chosen rows plus a reserve and frees the rest for real.
//
// Layout: per layer one tensor for K and one for V, [head_dim, rows], where head h's
// segment is the rows [offset(il, h), offset(il, h) + capacity(il, h)). When every head of
// a layer has the same capacity the tensor is a plain [head_dim, cap, n_head_kv] block.
// Rows of a segment are always sorted by position. K and V each have a row type
// (CacheTypes): F16, or ggml's Q8_0 / Q4_0 blocks (a row quantized when it is written).
//
// Mixed precision (docs/methods.md, "Mixed precision"): a compressed store may also hold
// DEMOTED rows, K and V of a lower type (CacheTypes::low), in a second tensor per layer with
// its own segments (il, h) and positions: a frozen run that compression made (new rows are
// always appended to the first run, at the cache types). The attention reads both runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ggml-cpp.h"
#include "kvlab/model.h"

namespace kvlab {

// The row types of K and V (llama.cpp's --cache-type-k / --cache-type-v): F16, Q8_0 (34
// bytes per 32 values) or Q4_0 (18 bytes per 32 values). A quantized type needs a head_dim
// that is a multiple of 32 (its block).
//
// rotate: quantized rows are stored rotated by a Walsh-Hadamard transform, as llama.cpp does
// (its attn_rot_k / attn_rot_v, on unless LLAMA_ATTN_ROT_DISABLE): where head_dim is a
// multiple of 64, Q and K are multiplied by the orthonormal Hadamard matrix of the largest
// power of two (>= 64) dividing head_dim when K is quantized, V by the one of size 64 when V
// is, and the attention's output by it again (H H = I). The products are unchanged while
// outliers spread over a block, so quantization loses less.
//
// low: the type of demoted rows (K and V alike; Q8_0 or Q4_0), GGML_TYPE_COUNT when the store
// holds none. Rotation is store-wide: K rows of both runs are rotated when K or low is
// quantized, V rows when V or low is (the F16 rows of a mixed store are then rotated too).
struct CacheTypes {
    ggml_type k = GGML_TYPE_F16;
    ggml_type v = GGML_TYPE_F16;
    bool rotate = true;
    ggml_type low = GGML_TYPE_COUNT;
    bool operator==(const CacheTypes &) const = default;
    bool quantized() const { return k != GGML_TYPE_F16 || v != GGML_TYPE_F16; }
    bool mixed() const { return low != GGML_TYPE_COUNT; }
    // The Hadamard sizes the rows of a head_dim take (0: not rotated).
    int32_t k_rotation(int32_t head_dim) const;
    int32_t v_rotation(int32_t head_dim) const;
};
// x[0..n) <- x H_n (the orthonormal Sylvester Hadamard matrix, its own inverse) for each of the
// len / n pieces of x; n a power of two.
void hadamard_rows(float * x, int64_t len, int32_t n);
// "f16", "q8_0", "q4_0" (llama.cpp's names); throws kvlab::Error naming the choices.
ggml_type parse_cache_type(const std::string & name);
const char * cache_type_name(ggml_type t);
// Bytes of one row of head_dim values of type t.
uint64_t cache_row_bytes(ggml_type t, int32_t head_dim);
// Whether demoting rows of K type k and V type v to `low` frees bytes: a low row smaller than
// both (q4_0 below q8_0 and f16, q8_0 below f16).
bool demotion_saves(ggml_type k, ggml_type v, ggml_type low, int32_t head_dim);

// Kept row indices per layer and KV head: keep[il][h] = ascending row indices.
using KeepPlan = std::vector<std::vector<std::vector<int32_t>>>;
// Saved positions per layer and KV head (ascending).
using SegmentPositions = std::vector<std::vector<std::vector<int32_t>>>;

class KvStore {
public:
    // Every segment gets `capacity` rows. Throws kvlab::Error for a quantized type whose
    // block does not divide head_dim.
    KvStore(const HParams & hp, ggml_backend * backend, int64_t capacity, CacheTypes types = {});
    // capacities[il][h]: rows of segment (il, h).
    KvStore(const HParams & hp, ggml_backend * backend, const std::vector<std::vector<int64_t>> & capacities,
            CacheTypes types = {});
    KvStore(KvStore &&) noexcept = default;
    KvStore & operator=(KvStore &&) noexcept = default;

    // A store restored from saved rows (a cache file): segment (il, h) holds the rows at
    // positions[il][h] (ascending, each below next_pos) plus room for `reserve` more; its
    // K/V data is undefined until write_rows() fills it. Throws kvlab::Error for a shape
    // that does not match hp or positions out of order.
    // A mixed store (types.low set) also gets its demoted rows' positions (low_positions,
    // the same shape; their data written by write_rows(..., low = true)).
    static KvStore restore(const HParams & hp, ggml_backend * backend, SegmentPositions positions, int32_t next_pos,
                           int64_t reserve, CacheTypes types = {}, SegmentPositions low_positions = {});

    // A deep, independent copy: same rows and positions, and capacities with room for at
    // least `room` more rows per segment (answering from the copy then never regrows it).
    KvStore copy(int64_t room = 0) const;

    int32_t n_layer() const { return int32_t(layers_.size()); }
    int32_t n_head_kv() const { return n_head_kv_; }
    int32_t head_dim() const { return head_dim_; }
    const CacheTypes & types() const { return types_; }
    int64_t capacity(int il, int h) const { return layers_[il].cap[h]; }
    int64_t offset(int il, int h) const { return layers_[il].off[h]; }
    // Rows of segment (il, h) at the cache types (the run new rows are appended to).
    int64_t n_rows(int il, int h) const { return int64_t(layers_[il].pos[h].size()); }
    int64_t total_rows() const;                                  // held rows over all segments, both runs
    std::vector<std::vector<int64_t>> rows_per_segment() const;  // [layer][head] held rows, both runs
    // Original positions of the rows of (layer, head), ascending.
    const std::vector<int32_t> & positions(int il, int h) const { return layers_[il].pos[h]; }
    // The demoted run of segment (il, h): rows, positions (ascending), first row in low_k/low_v(il).
    int64_t n_low(int il, int h) const { return int64_t(layers_[il].pos_lo[h].size()); }
    const std::vector<int32_t> & low_positions(int il, int h) const { return layers_[il].pos_lo[h]; }
    int64_t low_offset(int il, int h) const { return layers_[il].off_lo[h]; }
    int64_t total_low_rows() const;
    ggml_tensor * low_k(int il) const { return layers_[il].k_lo; }  // types().low [head_dim, low rows of the layer]
    ggml_tensor * low_v(int il) const { return layers_[il].v_lo; }
    // True when the heads of layer il hold the same positions in equal-capacity segments
    // and no demoted rows (the layer's attention can treat its heads as one block: the fast path).
    bool layer_uniform(int il) const;
    // True when every segment of every layer holds the same positions.
    bool uniform() const;
    // Absolute position the next appended token takes (never the compressed length).
    int32_t next_pos() const { return next_pos_; }

    ggml_tensor * k(int il) const { return layers_[il].k; }  // types().k [head_dim, rows of the layer]
    ggml_tensor * v(int il) const { return layers_[il].v; }

    // Makes room for n more rows in every segment, appended at most `batch` at a time
    // between slides (batch < 0: all n at once); a segment that is full grows (reallocating
    // the store and copying) to max(need, 1.5 x capacity). A sliding-window layer that
    // slides needs no more than max_window_rows(il, batch) rows, whatever n is.
    void reserve(int64_t n_more, int64_t batch = -1);

    // Sliding-window layers (HParams::window): a row at position x is seen by no query at
    // next_pos() or later once x <= next_pos() - window. slide() frees such rows, in whole
    // units of k_slide_rows from the front of each segment, so that the rows that remain
    // keep their offsets modulo the attention kernel's chunks (its arithmetic, hence the
    // logits, do not depend on when rows were freed). A sliding layer then holds at most
    // window - 1 + k_slide_rows - 1 rows between evaluations. While hold_all_rows(true) (a
    // context prefilled for compression: the methods score every layer's rows) nothing slides.
    static constexpr int64_t k_slide_rows = 512;
    void slide();
    void hold_all_rows(bool hold) { hold_all_ = hold; }
    bool holds_all_rows() const { return hold_all_; }
    int32_t window(int il) const { return hp_.window(il); }
    // The most rows a sliding layer il holds while `batch` tokens are evaluated (-1: no bound).
    int64_t max_window_rows(int il, int64_t batch) const;
    // The rows a full cache of an L-token context holds: L per global layer and segment,
    // min(L, window - 1) per sliding one (the rows the next query can see).
    int64_t full_rows(int64_t L) const;
    // True when a failed evaluation was rolled back past rows that slide() had freed: the
    // store lacks rows that its next query would see, and the engine refuses it.
    bool lost_rows() const { return lost_rows_; }
    // Records that the graph wrote n rows at the end of every segment, at positions
    // next_pos() .. next_pos()+n-1.
    void commit(int64_t n);
    // Undoes the last commit(n) (a failed graph computation).
    void rollback(int64_t n);
    // Keeps only the rows keep[il][h] (ascending, unique, in range) of every segment and
    // reallocates so that each segment holds exactly its kept rows plus `reserve` rows:
    // the memory of dropped rows is freed.
    // Demoted rows stay as they are.
    void compact(const KeepPlan & keep, int64_t reserve);
    // Mixed precision: keeps the rows `high` (at the cache types) and demotes the rows `low`
    // (both ascending row indices of each segment, disjoint) to type `low_type`, freeing the
    // others; rows are rotated as the new types require (CacheTypes::low). The store must not
    // hold demoted rows yet, or hold them of the same type (they are kept).
    void compact_mixed(const KeepPlan & high, const KeepPlan & low, ggml_type low_type, int64_t reserve);
    // Drops every row at position >= pos and continues at pos: the prompt a cache was
    // compressed with (a query-aware method's question) forgotten, its choice of rows kept.
    // Segments are reallocated to their rows plus `reserve`.
    void truncate(int32_t pos, int64_t reserve);
    // Keeps every row and reallocates each segment to its rows plus `reserve` (the full
    // cache with the same reserve a compressed one gets).
    void fit(int64_t reserve);

    // K or V rows of segment (il, h) as float32, [n_rows][head_dim]: quantized rows
    // dequantized by ggml's own functions and rotated back (the keys and values the model
    // computed, to within the quantization).
    std::vector<float> read_k(int il, int h) const;
    std::vector<float> read_v(int il, int h) const;
    // Rows [row0, row0 + n) of segment (il, h)'s K or V as float32, [n][head_dim].
    std::vector<float> read_k(int il, int h, int64_t row0, int64_t n) const;
    std::vector<float> read_v(int il, int h, int64_t row0, int64_t n) const;

    // The demoted rows of segment (il, h) as float32 [n_low][head_dim], K or V, rotated back.
    std::vector<float> read_low(int il, int h, bool value) const;

    // The held rows of segment (il, h) in their stored form: K (value=false) or V,
    // n_rows(il, h) x k_row_bytes() (or v_row_bytes()) bytes; low: the demoted run, n_low(il,
    // h) x low_row_bytes(). write_rows() overwrites them.
    void read_rows(int il, int h, bool value, void * dst, bool low = false) const;
    void write_rows(int il, int h, bool value, const void * src, bool low = false);

    // Allocated bytes of the K/V buffers, and the bytes the held rows need.
    uint64_t bytes() const;
    uint64_t used_bytes() const;
    uint64_t row_bytes() const;  // K + V bytes of one row of one head
    uint64_t k_row_bytes() const;
    uint64_t v_row_bytes() const;
    uint64_t low_row_bytes() const;  // K (= V) bytes of one demoted row (0 when none)

private:
    struct Layer {
        ggml_tensor * k = nullptr;              // types_.k [head_dim, rows of the layer], in ctx_
        ggml_tensor * v = nullptr;              // types_.v [head_dim, rows of the layer], in ctx_
        std::vector<int64_t> cap;               // [n_head_kv]
        std::vector<int64_t> off;               // [n_head_kv] first row of each segment
        std::vector<std::vector<int32_t>> pos;  // [n_head_kv][n_rows]
        ggml_tensor * k_lo = nullptr;           // types_.low [head_dim, demoted rows of the layer] (mixed only)
        ggml_tensor * v_lo = nullptr;
        std::vector<int64_t> off_lo;               // [n_head_kv] first row of each demoted run
        std::vector<std::vector<int32_t>> pos_lo;  // [n_head_kv][n_low]
    };
    using Counts = std::vector<std::vector<int64_t>>;
    KvStore(const HParams & hp, ggml_backend * backend, CacheTypes types);
    // An empty store of the same model, backend and types (what reallocation fills), with the
    // same demoted runs (their rows copied by copy_low_to).
    KvStore sibling(const Counts & capacities) const;
    void allocate(const Counts & capacities, const Counts & low_counts);
    Counts capacities() const;
    Counts low_counts() const;
    void copy_low_to(KvStore & out) const;
    // The one reallocation behind compact, compact_mixed, truncate and fit: rows `high` of the
    // first run stay, rows `demote` of it and `low_keep` of the demoted run form the new
    // demoted run (of types.low), each segment gets `reserve` free rows.
    void relayout(const KeepPlan & high, const KeepPlan & demote, const KeepPlan & low_keep, CacheTypes types,
                  int64_t reserve);
    // On sliding layers (unless every row is held): drops from keep the rows slide() would free,
    // in its whole units, before a reallocation sizes the segments.
    void drop_slid(KeepPlan & keep);

    HParams hp_;
    ggml_backend * backend_ = nullptr;  // the model's, not owned
    int32_t n_head_kv_ = 0;
    int32_t head_dim_ = 0;
    CacheTypes types_;
    int32_t next_pos_ = 0;
    bool hold_all_ = false;
    bool lost_rows_ = false;
    int32_t freed_below_ = 0;         // every position below it may have been freed by slide()
    ggml_context_ptr ctx_;            // tensor metadata of the K/V tensors
    ggml_backend_buffer_ptr buffer_;  // their data
    std::vector<Layer> layers_;
};

}  // namespace kvlab
