// kvlab's product of a Q4_1 weight matrix with a batch of activations: the arithmetic of
// ggml's CPU mul_mat for Q4_1 (activations quantized to Q8_1 by ggml's own routine, then
// per output ggml_vec_dot_q4_1_q8_1's exact sequence of operations), so every output is
// bit-identical to ggml's and to libllama's, but register-blocked: a tile of 4 weight rows x 8
// activation rows per pass, each weight block unpacked once for 8 outputs and each activation
// block loaded once for 4. ggml's loop unpacks and loads both for every single output. Below 8
// activation rows (decode) the weight rows go 8 at a time, two per vector register.
// AVX-512 (F, BW, VL, VNNI) only; elsewhere applies() is false and ggml_mul_mat runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ggml.h"

namespace kvlab::gemm {

// Whether mul_mat_q4_1 runs w x x: w Q4_1 2-D in a plain host buffer, x F32 2-D with contiguous
// rows. From k_min_batch activation rows on, the tiled kernel; below, the row kernel.
constexpr int64_t k_min_batch = 8;
bool applies(const ggml_tensor * w, const ggml_tensor * x);

// w [K, N] Q4_1 times x F32 [K, M] -> F32 [N, M]: two custom ops (pack, then the product).
ggml_tensor * mul_mat_q4_1(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);

// The two steps on plain memory (for the tests). pack: x's M rows of K floats (row stride
// x_stride floats) quantized to Q8_1 by ggml and laid out for the kernel, in packed_bytes(K, M)
// bytes; rows split over nth threads. product: dst[m * dst_stride + n] for the N weight rows
// (w_row_bytes apart); weight-row tiles split over nth threads.
bool available();  // compiled for AVX-512 with VNNI
size_t packed_bytes(int64_t K, int64_t M);
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth);
void product(const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed, int64_t M,
             float * dst, int64_t dst_stride, int ith, int nth);

}  // namespace kvlab::gemm
