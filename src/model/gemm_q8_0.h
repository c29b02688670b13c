// kvlab's product of a Q8_0 or Q5_0 weight matrix with a batch of activations: the arithmetic of
// ggml's CPU mul_mat for these types (activations quantized to Q8_0 by ggml's own routine; per
// output, ggml_vec_dot_q8_0_q8_0's or ggml_vec_dot_q5_0_q8_0's sequence of operations, which
// llamafile's tinyBLAS, ggml's path from 2 activation rows on, repeats per output: 8 lane sums
// of 4 products, acc = fma(d_w * d_y, float(sum), acc) per block, ggml's hsum of the 8 lanes), so
// every output is bit-identical to ggml's and libllama's. Register-blocked: from k_min_batch rows
// on, tiles of 4 weight rows x 8 activation rows, each weight block unpacked once per row tile;
// below (decode, the output head of a prefill's last row), 8 weight rows at a time, two per
// vector register, the activation block loaded once for 8 rows.
// AVX-512 (F, BW, VL, VNNI) only; elsewhere applies() is false and ggml_mul_mat runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace kvlab::gemm_q8_0 {

constexpr int64_t k_min_batch = 8;
bool available();  // compiled for AVX-512 with VNNI

// Whether mul_mat runs w x: w Q8_0 or Q5_0 2-D in a plain host buffer, x F32 2-D, contiguous rows.
bool applies(const ggml_tensor * w, const ggml_tensor * x);

// w [K, N] times x F32 [K, M] -> F32 [N, M]: two custom ops (pack x, then the product).
ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

}  // namespace kvlab::gemm_q8_0
