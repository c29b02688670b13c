// kvlab's product of a Q8_0 or Q5_0 weight matrix with ONE activation row (decode, and the output
// head of a prefill's last row): the arithmetic of ggml's CPU mul_mat for a single row (the row
// quantized to Q8_0 by ggml's own routine, then per output ggml_vec_dot_q8_0_q8_0's or
// ggml_vec_dot_q5_0_q8_0's exact sequence of operations), so every output is bit-identical to
// ggml's and libllama's; but 8 weight rows at a time, two per vector register, the activation block
// loaded once for 8 rows and the 8 scales converted at once. From 2 rows on ggml runs llamafile's
// tinyBLAS for these types (other arithmetic), so the kernel takes single rows only.
// AVX-512 (F, BW, VL, VNNI) only; elsewhere applies() is false and ggml_mul_mat runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace kvlab::gemv {

bool available();  // compiled for AVX-512 with VNNI

// Whether mul_mat_row runs w x: w Q8_0 or Q5_0 2-D in a plain host buffer, x F32 [K, 1].
bool applies(const ggml_tensor * w, const ggml_tensor * x);

// w [K, N] times x F32 [K, 1] -> F32 [N, 1]: two custom ops (quantize x, then the product).
ggml_tensor * mul_mat_row(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// The product on plain memory: y is x quantized to Q8_0 by ggml (K / 32 blocks); dst[n] for the N
// weight rows of type (w_row_bytes apart); groups of 8 rows split over nth threads.
void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * y,
             float * dst, int ith, int nth);

}  // namespace kvlab::gemv
