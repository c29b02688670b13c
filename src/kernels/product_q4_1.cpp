// kvlab's product of a Q4_1 weight matrix with a batch of activations: the arithmetic of
// ggml's CPU mul_mat for Q4_1 (activations quantized to Q8_1 by ggml's own routine, then
// per output ggml_vec_dot_q4_1_q8_1's exact sequence of operations), so every output is
// bit-identical to ggml's and to libllama's, but register-blocked: a tile of 4 weight rows x 8
// activation rows per pass, each weight block unpacked once for 8 outputs and each activation
// block loaded once for 4. ggml's loop unpacks and loads both for every single output. Below 8
// activation rows (decode) the weight rows go 8 at a time, two per vector register.
// AVX-512 (F, BW, VL, VNNI) only; elsewhere available() is false and ggml_mul_mat runs.

#include <algorithm>
#include <cstring>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "kernels/products.h"
#include "kernels/vnni.h"

namespace kvlab::kernels {

namespace {

constexpr int64_t k_min_batch = 8;  // activation rows from which the tiled kernel runs; below, the row kernel
constexpr size_t k_w_block = 20;    // block_q4_1: f16 d, f16 m, 16 bytes of nibbles
constexpr size_t k_y_block = 36;    // block_q8_1: f16 d, f16 s (= d * sum of qs), 32 int8
constexpr int k_rows = vnni::k_tile_rows;
constexpr int k_cols = vnni::k_tile_cols;
using vnni::padded_cols;

// The packed activations, for M rows padded to Mp (a multiple of k_cols), nb blocks each:
//   qs: [Mp/2 pairs][nb][64 bytes]: the pair's two rows' 32 int8 of block ib side by side
//   d, s: [nb][Mp] float (the blocks' f16 scale and sum, converted); 0 in padded rows
struct Packed {
    uint8_t * qs;
    float * d;
    float * s;
    Packed(uint8_t * p, int64_t nb, int64_t Mp)
        : qs(p), d(reinterpret_cast<float *>(p + Mp / 2 * nb * 64)), s(d + nb * Mp) {}
};

size_t packed_bytes(int64_t K, int64_t M) {
    if (M < k_min_batch) return size_t(M * (K / k_qk)) * k_y_block;  // ggml's Q8_1 rows
    const int64_t nb = K / k_qk, Mp = padded_cols(M);
    return size_t(Mp / 2 * nb * 64 + 2 * nb * Mp * int64_t(sizeof(float)));
}

// A thread's scratch: a row quantized by ggml's routine before it is laid out (batches only).
SliceSize pack_scratch(int64_t K, int64_t M) {
    return M < k_min_batch ? SliceSize() : SliceSize().add<uint8_t>(size_t(K / k_qk) * k_y_block);
}

void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth, Slice scratch) {
    // ggml's own quantize_row_q8_1: the same bytes as ggml's mul_mat
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1)->from_float;
    if (M < k_min_batch) {  // ggml's layout, rows one after the other
        for (int64_t m = ith; m < M; m += nth) quantize(x + m * x_stride, packed + m * (K / k_qk) * k_y_block, K);
        return;
    }
    const int64_t nb = K / k_qk, Mp = padded_cols(M);
    Packed p(packed, nb, Mp);
    uint8_t * row = scratch.take<uint8_t>(size_t(nb) * k_y_block);
    for (int64_t m = ith; m < Mp; m += nth) {
        uint8_t * pair = p.qs + (m / 2) * nb * 64 + (m % 2) * 32;
        if (m >= M) {
            for (int64_t ib = 0; ib < nb; ++ib) {
                std::memset(pair + ib * 64, 0, 32);
                p.d[ib * Mp + m] = 0.0f;
                p.s[ib * Mp + m] = 0.0f;
            }
            continue;
        }
        quantize(x + m * x_stride, row, K);
        for (int64_t ib = 0; ib < nb; ++ib) {
            const uint8_t * b = row + ib * k_y_block;
            ggml_fp16_t d, s;
            std::memcpy(&d, b, 2);
            std::memcpy(&s, b + 2, 2);
            std::memcpy(pair + ib * 64, b + 4, 32);
            p.d[ib * Mp + m] = ggml_fp16_to_fp32(d);
            p.s[ib * Mp + m] = ggml_fp16_to_fp32(s);
        }
    }
}

#ifdef KVLAB_VNNI

namespace {

using vnni::f16;
using vnni::hsum8;
using vnni::PairSelect;
using vnni::unpack_nibbles;

// A tile's weight rows unpacked once for all its column tiles: per row and block the 32 values
// as bytes, twice (both 256-bit halves of a zmm), and the block's scale and minimum as floats.
// In the thread's scratch (product_scratch).
struct RowTile {
    uint8_t * q;   // [R][nb][64]
    float *d, *m;  // [R][nb]
    RowTile(Slice & s, int64_t nb)
        : q(s.take<uint8_t>(size_t(k_rows * nb) * 64)),
          d(s.take<float>(size_t(k_rows * nb))),
          m(s.take<float>(size_t(k_rows * nb))) {}
    void unpack(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb) {
        for (int r = 0; r < R; ++r)
            for (int64_t ib = 0; ib < nb; ++ib) {
                const uint8_t * b = w + r * w_row_bytes + ib * k_w_block;
                const __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 4)));
                _mm512_storeu_si512(&q[size_t(r * nb + ib) * 64], unpack_nibbles(x));
                d[r * nb + ib] = f16(b);
                m[r * nb + ib] = f16(b + 2);
            }
    }
};

// One tile: R weight rows (R <= k_rows) x k_cols activation rows c0..c0+7. Per output and
// block, as ggml_vec_dot_q4_1_q8_1: dot = the 32 u8 x s8 products summed in 8 lanes of 4
// consecutive values (vpdpbusd), acc = fma(d_w * d_y, float(dot), acc); summs = fma(m_w, s_y,
// summs); the output is hsum8(acc) + summs.
template <int R>
void tile(const RowTile & rt, int64_t nb, const Packed & p, int64_t Mp, int64_t c0, float * out) {
    __m512 acc[R][4];
    __m256 summ[R];
    for (int r = 0; r < R; ++r) {
        summ[r] = _mm256_setzero_ps();
        for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
    }
    const PairSelect ps;  // lanes 0-7 take the pair's first row's scale, 8-15 the second's
    const uint8_t * yq = p.qs + (c0 / 2) * nb * 64;
    for (int64_t ib = 0; ib < nb; ++ib) {
        const __m512 dy = _mm512_zextps256_ps512(_mm256_loadu_ps(p.d + ib * Mp + c0));
        const __m256 sy = _mm256_loadu_ps(p.s + ib * Mp + c0);
        for (int r = 0; r < R; ++r) summ[r] = _mm256_fmadd_ps(_mm256_set1_ps(rt.m[r * nb + ib]), sy, summ[r]);
        for (int q = 0; q < 4; ++q) {
            const __m512i y = _mm512_loadu_si512(yq + (q * nb + ib) * 64);
            const __m512 dq = _mm512_permutexvar_ps(ps.sel[q], dy);
            for (int r = 0; r < R; ++r) {
                const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(rt.d[r * nb + ib]), dq);
                const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), _mm512_loadu_si512(&rt.q[size_t(r * nb + ib) * 64]), y));
                acc[r][q] = _mm512_fmadd_ps(dd, dot, acc[r][q]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        float a[4][16], sm[8];
        for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a[q], acc[r][q]);
        _mm256_storeu_ps(sm, summ[r]);
        for (int c = 0; c < k_cols; ++c) out[c * k_rows + r] = hsum8(a[c / 2] + (c % 2) * 8) + sm[c];
    }
}

// A small batch (decode): per activation row, 8 weight rows at a time, two per zmm (the row
// pair's blocks side by side, the activation block in both halves), each output still its own
// chain of ggml's operations; the 8 rows' scales and minima loaded and converted at once.
void rows8(const uint8_t * w, size_t w_row_bytes, int64_t nb, const uint8_t * y, float * out) {
    const __m512i even = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 15, 13, 11, 9, 7, 5, 3, 1);
    const PairSelect ps;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m256 summ = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ++ib) {
        const uint8_t * yb = y + ib * k_y_block;
        const __m512i yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb + 4)));
        const float dy = f16(yb), sy = f16(yb + 2);
        // the 8 rows' (d, m) f16 pairs -> floats d[0..7], m[0..7]
        const uint8_t * wb = w + ib * k_w_block;
        for (int r = 0; r < 8; ++r) vnni::prefetch_ahead(wb + r * w_row_bytes);
        uint32_t dm8[8];  // plain loads: a gather is slow where microcode guards it (GDS)
        for (int r = 0; r < 8; ++r) std::memcpy(&dm8[r], wb + size_t(r) * w_row_bytes, 4);
        const __m256i dm = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(dm8));
        const __m512 dmf = _mm512_cvtph_ps(dm);
        const __m512 dw = _mm512_permutexvar_ps(even, dmf), mw = _mm512_permutexvar_ps(odd, dmf);
        summ = _mm256_fmadd_ps(_mm512_castps512_ps256(mw), _mm256_set1_ps(sy), summ);
        const __m512 ddw = _mm512_mul_ps(dw, _mm512_set1_ps(dy));  // d_w * d_y, lanes 0-7
        for (int q = 0; q < 4; ++q) {
            const uint8_t * b0 = wb + size_t(2 * q) * w_row_bytes + 4;
            const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b0)));
            const __m256i hi =
                _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b0 + w_row_bytes)));
            const __m512i x = unpack_nibbles(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), x, yq));
            acc[q] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ps.sel[q], ddw), dot, acc[q]);
        }
    }
    float a[4][16], sm[8];
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a[q], acc[q]);
    _mm256_storeu_ps(sm, summ);
    for (int r = 0; r < 8; ++r) out[r] = hsum8(a[r / 2] + (r % 2) * 8) + sm[r];
}

void product_rows(const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * y, int64_t M,
                  float * dst, int64_t dst_stride, int ith, int nth) {
    const int64_t nb = K / k_qk;
    const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(GGML_TYPE_Q4_1)->vec_dot;
    const auto ym = [&](int64_t m) { return y + m * nb * int64_t(k_y_block); };
    vnni::for_each_row_group(
        N, M, ith, nth,
        [&](int64_t n0, int64_t m) { rows8(w + n0 * w_row_bytes, w_row_bytes, nb, ym(m), dst + m * dst_stride + n0); },
        [&](int64_t n, int64_t m) {  // the last rows: ggml's own dot product
            vec_dot(int(K), dst + m * dst_stride + n, 0, w + n * w_row_bytes, 0, ym(m), 0, 1);
        });
}

}  // namespace

bool available() {
    return true;
}

void product(const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed, int64_t M,
             float * dst, int64_t dst_stride, int ith, int nth, Slice & scratch) {
    if (M < k_min_batch) return product_rows(w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
    const int64_t nb = K / k_qk, Mp = padded_cols(M);
    const Packed p(const_cast<uint8_t *>(packed), nb, Mp);
    RowTile rt(scratch, nb);
    vnni::for_each_tile(
        N, M, dst, dst_stride, ith, nth,
        [&](int64_t n0, int R) { rt.unpack(w + n0 * w_row_bytes, w_row_bytes, R, nb); },
        [&](auto R, int64_t c0, float * out) { tile<decltype(R)::value>(rt, nb, p, Mp, c0, out); });
}

#else

bool available() {
    return false;
}

void product(const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int, int, Slice &) {
}

#endif

bool supports(ggml_type type) {
    return type == GGML_TYPE_Q4_1;
}

// A thread's scratch: its tile's weight rows unpacked (RowTile; batches only).
SliceSize product_scratch(int64_t K, int64_t M) {
    const size_t blocks = size_t(k_rows * (K / k_qk));
    return M < k_min_batch ? SliceSize() : SliceSize().add<uint8_t>(blocks * 64).add<float>(blocks).add<float>(blocks);
}

void product_any(ggml_type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
                 int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice scratch) {
    product(w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
}

}  // namespace

const ProductKernel & q4_1_kernel() {
    static const ProductKernel k = {"q4_1",       k_min_batch,     available, supports,   packed_bytes,
                                    pack_scratch, product_scratch, pack,      product_any};
    return k;
}

}  // namespace kvlab::kernels
