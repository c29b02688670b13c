// kvlab's weight products as ggml graph nodes: two custom ops, the activations packed once for
// the kernel (quantized and laid out), then the product over the weight rows; both split over
// the backend's threads. Shared by gemm_q4_1, gemm_q8_0 and gemm_amx.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace kvlab::gemm_common {

struct PackedProduct {
    // x's M rows of K floats (row stride x_stride floats) into packed; rows split over nth threads
    void (*pack)(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth);
    // dst[m * dst_stride + n] = (w x)[n][m] for w's rows; weight rows split over nth threads
    void (*product)(const ggml_tensor * w, const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith,
                    int nth);
};

// The product step of a kernel whose product takes w's bytes, row stride and shape.
template <void (*Product)(const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int,
                          int)>
void product_of(const ggml_tensor * w, const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith,
                int nth) {
    Product(static_cast<const uint8_t *>(w->data), w->nb[1], w->ne[0], w->ne[1], packed, M, dst, dst_stride, ith, nth);
}

// w [K, N] times x F32 [K, M] -> F32 [N, M], through k (a static object: the graph keeps its address).
ggml_tensor * packed_product(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, size_t packed_bytes,
                             const PackedProduct & k);
// The two nodes apart, for several weights times one x: pack_node once, product_node for each.
ggml_tensor * pack_node(ggml_context * ctx, ggml_tensor * x, size_t packed_bytes, const PackedProduct & k);
ggml_tensor * product_node(ggml_context * ctx, ggml_tensor * w, ggml_tensor * packed, ggml_tensor * x,
                           const PackedProduct & k);

// What every kernel needs: w 2-D of `type`-sized blocks of k_block values, in a plain host
// buffer; x F32 2-D with contiguous rows, as long as w's.
bool plain_operands(const ggml_tensor * w, const ggml_tensor * x, int64_t k_block);

}  // namespace kvlab::gemm_common
