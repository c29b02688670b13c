// kvlab's own CPU attention over KV-store segments of any shape: every KV head reads
// its own rows (own length, own positions), so layers and heads may differ in length
// and nothing is padded. Rows are F16 or ggml's Q8_0 / Q4_0 blocks, converted exactly to
// float32 a block of rows at a time. Float32 throughout (Q, scores, softmax, V accumulation);
// ggml's CPU flash attention rounds Q to F16 and accumulates V in F16 below 64 query
// rows, which makes small chunks and decode drift from large ones.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ggml.h"
#include "kernels/scratch.h"

namespace kvlab::kernels::attn {

// The most query heads per KV head (GQA group) the kernel handles: a work unit holds the
// query vectors of k_tile rows times the group in fixed arrays. The engine refuses models
// with larger groups when it is constructed. head_dim has no limit (scratch is sized at
// run time).
constexpr int k_max_group = 16;

// One KV head's rows: K and V [n][head_dim] of their types (F16, Q8_0 or Q4_0: rows of
// whole blocks, dequantized a block of rows at a time, exactly as ggml's dequantizers do),
// positions ascending.
struct Segment {
    const void * k = nullptr;
    const void * v = nullptr;
    ggml_type k_type = GGML_TYPE_F16;
    ggml_type v_type = GGML_TYPE_F16;
    const int32_t * pos = nullptr;
    int64_t n = 0;
};

struct Problem {
    int32_t n_q = 0;  // query rows
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;
    float scale = 1.0f;
    const int32_t * q_pos = nullptr;  // [n_q] absolute positions; a query sees rows with pos <= its own
    // > 0: a sliding-window layer, a query at p sees only rows with p - window < pos <= p
    int32_t window = 0;
    std::vector<Segment> seg;  // [n_head_kv]
    // Mixed precision: the demoted run of each KV head ([n_head_kv], or empty), rows of a lower
    // type that the store never appends to. A head's chunks are those of its demoted run, then
    // those of seg: appending to seg never moves a chunk boundary.
    std::vector<Segment> low;
    // Rows are taken in fixed chunks of chunk_rows (chunk c = rows [c*chunk_rows, (c+1)*chunk_rows)),
    // each chunk's partial result merged in chunk order: the arithmetic of every output
    // depends on nothing but its own rows, never on the number of queries or threads, so
    // prefill in chunks of any size and decode give bit-identical attention.
    int64_t chunk_rows = 512;
    int32_t n_chunks() const;    // low_chunks() plus the chunks of the longest segment
    int32_t low_chunks() const;  // the chunks of the longest demoted run (0: none)
    // The run chunk c of head g reads and the chunk's index within that run.
    std::pair<const Segment *, int32_t> chunk_run(int32_t g, int32_t c) const;
};

// Computes the partial results of the work units (query row, head, chunk) assigned to
// thread ith of nth. q: F32, element (d, head, row) at q[row * q_row_stride + head *
// q_head_stride + d]. partial: F32 [n_chunks][n_q][n_head][head_dim + 2] (unnormalised
// output, running max, running sum); merge() turns it into F32 [n_q][n_head][head_dim].
// pre: the blocks of K and V already converted by convert(), or nullptr (each unit converts the
// blocks it reads). The result is the same to the bit either way. scratch: the thread's
// compute_scratch(p) bytes (kernels/scratch.h); what it held before does not matter.
SliceSize compute_scratch(const Problem & p);
void compute(const Problem & p, const float * q, int64_t q_head_stride, int64_t q_row_stride, float * partial, int ith,
             int nth, const float * pre, Slice scratch);

// Conversion of K and V to float32 once for all query tiles (a prefill): whether it pays (more
// than one tile of queries, and chunks made of whole blocks), the floats it needs, and the
// conversion of the blocks assigned to thread ith of nth (into pre's first 64-byte boundary on;
// compute() reads them from there).
bool converts_ahead(const Problem & p);
int64_t converted_floats(const Problem & p);
void convert(const Problem & p, float * pre, int ith, int nth);
void merge(const Problem & p, const float * partial, float * out, int ith, int nth);

// Several problems over one q (a batch of sequences, each attending over its own rows): problem
// i's queries are q's rows [row0[i], row0[i] + n_q). Each problem's results are those compute()
// and merge() give it alone, to the bit: the units of all problems are only shared out between
// the threads together. No blocks are converted ahead.
struct Batch {
    std::vector<const Problem *> problems;
    std::vector<int64_t> row0;
    SliceSize scratch() const;  // a thread's, for any of the problems
};
size_t partial_floats(const Problem & p);  // [n_chunks][n_q][n_head][head_dim + 2]
// partial: the problems' partial results one after the other; out: F32 [rows of q][n_head][head_dim].
void compute_batch(const Batch & b, const float * q, int64_t q_head_stride, int64_t q_row_stride, float * partial,
                   int ith, int nth, Slice scratch);
void merge_batch(const Batch & b, const float * partial, float * out, int ith, int nth);

// Adds the attention to a graph: q F32 [head_dim, n_head, n_q]; deps are nodes that must
// run first (the writes of the new rows). Returns F32 [head_dim, n_head, n_q]. The
// problem must outlive the graph's computation. scratch: the graph's, which the threads'
// compute_scratch comes from.
ggml_tensor * build(ggml_context * ctx, ggml_tensor * q, const Problem * p, const std::vector<ggml_tensor *> & deps,
                    GraphScratch & scratch);
// The same for a batch (q F32 [head_dim, n_head, rows], the rows of every problem); the batch
// and its problems must outlive the graph's computation.
ggml_tensor * build_batch(ggml_context * ctx, ggml_tensor * q, const Batch * b, const std::vector<ggml_tensor *> & deps,
                          GraphScratch & scratch);

}  // namespace kvlab::kernels::attn
