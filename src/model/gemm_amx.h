// kvlab's own arithmetic for the products of Q4_1, Q5_0 and Q8_0 weights, built for Intel AMX:
// activations quantized by ggml's own routine (quantize_row_q8_1 for Q4_1, whose bytes and
// scale quantize_row_q8_0 shares for the other two), then per output and per 32-value block ONE
// exact integer sum of the block's 32 products, and in block order
//     Q4_1:        acc = fma(d_w * d_y, float(sum), acc);  acc = fma(m_w, s_y, acc)
//     Q5_0, Q8_0:  acc = fma(d_w * d_y, float(sum), acc)
// (ggml sums each block in 8 lanes of 4 products, each lane its own float chain, and for Q4_1
// adds the minima's chain at the end: the same terms, rounded in another order; a few float ulps
// apart). The weights enter the integer units as unsigned bytes, value + offset (0 for Q4_1's
// nibbles, 16 for Q5_0, 128 for Q8_0), and offset x the block's exact activation sum is taken off
// each integer sum, which stays exact. The integer block sums come from AMX tiles (TDPBSUD, 16
// activation rows x 16 weight rows x one block per instruction) from k_min_batch rows on, and from
// AVX-512 VNNI below (decode), both with the same operations per output: every output has the same
// bits whatever the batch size, the chunk or the thread count.
//
// Which arithmetic the products of this process use (set_mode; `kvlab --products`):
//   ggml: gemm_q4_1.h and gemm_q8_0.h, bit-identical to ggml's mul_mat and libllama's logits;
//   amx:  this file, where the CPU has AMX-INT8 and the kernel grants the tile state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ggml.h"

namespace kvlab::gemm_amx {

enum class Mode { ggml, amx };
// "auto" picks amx where available(), else ggml; "amx" throws kvlab::Error where not available.
Mode parse_mode(const std::string & name);
const char * mode_name(Mode m);
void set_mode(Mode m);
Mode mode();  // default: amx where available()

// Compiled with AMX-INT8 and AVX-512 VNNI, the CPU has them and Linux granted this process the
// AMX tile state (asked once).
bool available();

constexpr int64_t k_min_batch = 16;  // activation rows from which the AMX tiles run

// The weight types this arithmetic runs: Q4_1, Q5_0, Q8_0.
bool supports(ggml_type type);

// Whether mul_mat runs w x: mode() is amx, w of a supported type, 2-D in a plain host buffer,
// x F32 2-D with contiguous rows.
bool applies(const ggml_tensor * w, const ggml_tensor * x);

// w [K, N] times x F32 [K, M] -> F32 [N, M]: two custom ops (pack x, then the product); one
// below k_min_batch rows (decode), where each thread quantizes x for itself.
ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x);
// Several weights times one x (q, k, v; gate, up), of any supported types: x packed once (from
// k_min_batch rows on). Each w must apply.
void mul_mats(ggml_context * ctx, ggml_tensor * const * w, ggml_tensor ** out, int n, ggml_tensor * x);

// The two steps on plain memory (for the tests): pack quantizes x's M rows (row stride x_stride
// floats) and lays them out in packed_bytes(K, M) bytes; product writes dst[m * dst_stride + n]
// for w of `type`. Rows (pack) and 16-row weight panels (product) split over nth threads.
size_t packed_bytes(int64_t K, int64_t M);
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth);
void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
             int64_t M, float * dst, int64_t dst_stride, int ith, int nth);

}  // namespace kvlab::gemm_amx
