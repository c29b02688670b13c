// kvlab's quantized weight products (docs/kernels.md): three kernels behind one descriptor, and
// the graph nodes that run them. Every kernel packs the activations once (quantized by ggml's own
// routine and laid out for it), then multiplies the weight rows:
//   q4_1_kernel(): Q4_1 weights, ggml's arithmetic (product_q4_1.cpp);
//   q8_0_kernel(): Q8_0 and Q5_0 weights, ggml's arithmetic (product_q8_0.cpp);
//   amx_kernel():  Q4_1, Q5_0 and Q8_0 weights, kvlab's block order, AMX tiles for batches
//                  (product_amx.cpp); from panels Q4_K and Q6_K too (Q6_K's batches by VNNI);
//   vnni_kernel(): the same block order and bits, AVX-512 VNNI for every batch (product_vnni.cpp).
// Under Products::ggml the first two run (bit-identical to ggml_mul_mat), under Products::amx the
// third, under Products::vnni the fourth; where none applies (another type, a repacked weight, a CPU without AVX-512
// VNNI) ggml's own mul_mat runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>

#include "ggml.h"
#include "kernels/scratch.h"
#include "kvlab/kernels.h"

namespace kvlab::kernels {

constexpr int64_t k_qk = 32;  // values per block of every supported type (QK4_1 = QK5_0 = QK8_0 = QK8_1)

struct ProductKernel {
    const char * name;
    // Activation rows from which the batch layout and kernel run; below, each thread quantizes
    // the rows for itself inside the product's node (decode: no pack node between two barriers).
    int64_t min_batch;
    bool (*available)();  // compiled for, and running on, a CPU with what the kernel needs
    bool (*supports)(ggml_type type);
    size_t (*packed_bytes)(int64_t K, int64_t M);
    // The scratch each thread of pack and of product takes (kernels/scratch.h), for K x M.
    SliceSize (*pack_scratch)(int64_t K, int64_t M);
    SliceSize (*product_scratch)(int64_t K, int64_t M);
    // x's M rows of K floats (row stride x_stride floats) quantized and laid out in
    // packed_bytes(K, M) bytes; rows split over nth threads.
    void (*pack)(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth,
                 Slice scratch);
    // dst[m * dst_stride + n] = (w x)[n][m] for the N rows of w (K values of `type`, w_row_bytes
    // apart); weight rows split over nth threads.
    void (*product)(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
                    int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice scratch);
};

const ProductKernel & q4_1_kernel();
const ProductKernel & q8_0_kernel();
// panels: the kernel that reads weights packed by pack_panels.
const ProductKernel & amx_kernel(bool panels = false);
const ProductKernel & vnni_kernel(bool panels = false);
// Whether amx_kernel()'s pack and its products of fewer than min_batch rows run here, and so
// vnni_kernel(): AVX-512 VNNI and BITALG (AMD Zen 4 and 5 too), no AMX needed;
// amx_kernel().available() is the tiles'.
bool amx_rows_available();

// The block-order kernels' weight layout (product_amx.cpp): 16-row panels, rewritten in place in
// the same bytes, each panel block's values, scales and minima read as whole vectors (decode
// streams them instead of gathering 16 rows' blocks). Only for weights that nothing else reads:
// ggml's own mul_mat cannot read them. panels_available: a Q4_1, Q5_0, Q8_0, Q4_K or Q6_K 2-D
// matrix with whole 16-row panels (and whole blocks), contiguous, on a CPU that runs the block
// order. The K-quants run only from panels.
bool panels_available(const ggml_tensor * w);
void pack_panels(ggml_tensor * w);
// Rows ids[0..n) of a Q8_0 matrix packed into panels (a tied embedding table), dequantized to
// the floats of ggml_get_rows; row i at out + i * out_stride.
void panel_rows(const ggml_tensor * w, const int32_t * ids, int64_t n, float * out, int64_t out_stride);

// Which weights were packed into panels (pack_panels), for the graphs to pick the kernels that
// read them.
using PanelSet = std::unordered_set<const ggml_tensor *>;

// The kernel that runs w x under `products`, or nullptr where ggml_mul_mat runs: one that is
// available and supports w's type, w 2-D in a plain host buffer (not repacked), x F32 2-D with
// contiguous rows as long as w's. For a weight in `panels` (null: none), the block-order kernel
// that reads them.
const ProductKernel * product_kernel(Products products, const ggml_tensor * w, const ggml_tensor * x,
                                     const PanelSet * panels = nullptr);

// Rows of w [K, N] for ids I32 [n] -> F32 [K, n]: ggml_get_rows, or panel_rows for w in panels.
ggml_tensor * get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids, const PanelSet * panels = nullptr);

// w [K, N] (any type) times x F32 [K, M] -> F32 [N, M]: ggml_mul_mat's result, computed by
// product_kernel(products, w, x, panels) where one applies; a weight in `panels` always by its
// kernel (x made contiguous F32 first where it is not).
// scratch: the graph's (kernels/scratch.h), which kvlab's nodes take their threads' memory from.
ggml_tensor * mul_mat(ggml_context * ctx, Products products, GraphScratch & scratch, ggml_tensor * w, ggml_tensor * x,
                      const PanelSet * panels = nullptr);
// out[i] = w[i] x for n weights: x packed once when one kernel runs every product (q, k, v;
// gate, up).
void mul_mats(ggml_context * ctx, Products products, GraphScratch & scratch, ggml_tensor * const * w,
              ggml_tensor ** out, int n, ggml_tensor * x, const PanelSet * panels = nullptr);

}  // namespace kvlab::kernels
