// kvlab's product of a Q8_0 or Q5_0 weight matrix with a batch of activations: the arithmetic of
// ggml's CPU mul_mat for these types (activations quantized to Q8_0 by ggml's own routine; per
// output, ggml_vec_dot_q8_0_q8_0's or ggml_vec_dot_q5_0_q8_0's sequence of operations, which
// llamafile's tinyBLAS, ggml's path from 2 activation rows on, repeats per output: 8 lane sums
// of 4 products, acc = fma(d_w * d_y, float(sum), acc) per block, ggml's hsum of the 8 lanes), so
// every output is bit-identical to ggml's and libllama's. Register-blocked: from k_min_batch rows
// on, tiles of 4 weight rows x 8 activation rows, each weight block unpacked once per row tile;
// below (decode, the output head of a prefill's last row), 8 weight rows at a time, two per
// vector register, the activation block loaded once for 8 rows.
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
constexpr size_t k_y_block = 34;    // block_q8_0: f16 d, 32 int8
constexpr int k_rows = vnni::k_tile_rows;
constexpr int k_cols = vnni::k_tile_cols;
using vnni::padded_cols;

// The packed activations of a batch (M >= k_min_batch), M rows padded to Mp (a multiple of
// k_cols), nb blocks each:
//   qs:   [Mp/2 pairs][nb][64 bytes]: the pair's two rows' 32 int8 of block ib side by side
//   sums: [Mp/2 pairs][nb][16 int32]: their sums of 4 consecutive values (the lanes of vpdpbusd)
//   d:    [nb][Mp] float: the blocks' f16 scale, converted; 0 in padded rows
struct Packed {
    uint8_t * qs;
    int32_t * sums;
    float * d;
    Packed(uint8_t * p, int64_t nb, int64_t Mp)
        : qs(p),
          sums(reinterpret_cast<int32_t *>(p + Mp / 2 * nb * 64)),
          d(reinterpret_cast<float *>(p + Mp / 2 * nb * 128)) {}
};

size_t packed_bytes(int64_t K, int64_t M) {
    const int64_t nb = K / k_qk;
    if (M < k_min_batch) return size_t(M * nb) * k_y_block;  // ggml's Q8_0 rows
    const int64_t Mp = padded_cols(M);
    return size_t(Mp / 2 * nb * 128 + nb * Mp * int64_t(sizeof(float)));
}

// A thread's scratch: a row quantized by ggml's routine before it is laid out (batches only).
SliceSize pack_scratch(int64_t K, int64_t M) {
    return M < k_min_batch ? SliceSize() : SliceSize().add<uint8_t>(size_t(K / k_qk) * k_y_block);
}

void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth, Slice scratch) {
    // ggml's own quantize_row_q8_0: the same bytes as ggml's mul_mat
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    const int64_t nb = K / k_qk;
    if (M < k_min_batch) {  // ggml's layout, rows one after the other
        for (int64_t m = ith; m < M; m += nth) quantize(x + m * x_stride, packed + m * nb * k_y_block, K);
        return;
    }
    const int64_t Mp = padded_cols(M);
    Packed p(packed, nb, Mp);
    uint8_t * row = scratch.take<uint8_t>(size_t(nb) * k_y_block);
    for (int64_t m = ith; m < Mp; m += nth) {
        uint8_t * pair = p.qs + (m / 2) * nb * 64 + (m % 2) * 32;
        int32_t * sums = p.sums + (m / 2) * nb * 16 + (m % 2) * 8;
        if (m < M) quantize(x + m * x_stride, row, K);
        for (int64_t ib = 0; ib < nb; ++ib) {
            const uint8_t * b = row + ib * k_y_block;
            if (m >= M) {
                std::memset(pair + ib * 64, 0, 32);
                std::fill(sums + ib * 16, sums + ib * 16 + 8, 0);
                p.d[ib * Mp + m] = 0.0f;
                continue;
            }
            ggml_fp16_t d;
            std::memcpy(&d, b, 2);
            std::memcpy(pair + ib * 64, b + 2, 32);
            for (int l = 0; l < 8; ++l) {
                int32_t s = 0;
                for (int i = 0; i < 4; ++i) s += int8_t(b[2 + 4 * l + i]);
                sums[ib * 16 + l] = s;
            }
            p.d[ib * Mp + m] = ggml_fp16_to_fp32(d);
        }
    }
}

#ifdef KVLAB_VNNI

using vnni::f16;
using vnni::hsum8;

// The weight types: a block's bytes, and the 32 values of one block as unsigned bytes u = value +
// offset for vpdpbusd, in a 256-bit half; the offset times the activations' 4-value sums is taken
// off the integer sums, which stay exact.
struct Q8_0 {  // block_q8_0: f16 d, 32 int8
    static constexpr size_t block = 34;
    static constexpr int offset = 128, offset_shift = 7;
    static __m256i values(const uint8_t * b) {
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(b + 2)),
                                _mm256_set1_epi8(char(0x80)));
    }
};

struct Q5_0 {  // block_q5_0: f16 d, 32 high bits, 16 bytes of nibbles; value = (nibble | bit << 4) - 16
    static constexpr size_t block = 22;
    static constexpr int offset = 16, offset_shift = 4;
    static __m256i values(const uint8_t * b) {
        const __m512i x = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 6)));
        const __m256i nib = _mm512_castsi512_si256(vnni::unpack_nibbles(x));
        uint32_t h;  // bit j: the high bit of value j (ggml's bytes_from_bits_32)
        std::memcpy(&h, b + 2, 4);
        return _mm256_or_si256(nib, _mm256_maskz_mov_epi8(__mmask32(h), _mm256_set1_epi8(0x10)));
    }
};

// Two rows' blocks in one zmm: b0's values in lanes 0-31, b1's in 32-63.
template <class W>
inline __m512i pair_values(const uint8_t * b0, const uint8_t * b1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(W::values(b0)), W::values(b1), 1);
}

// 8 weight rows against one activation row y (ggml's Q8_0 row), two per zmm (the activation block
// in both halves).
template <class W>
void rows8(const uint8_t * w, size_t w_row_bytes, int64_t nb, const uint8_t * y, float * out) {
    const vnni::PairSelect ps;
    const __m512i offset = _mm512_set1_epi8(char(W::offset));
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t ib = 0; ib < nb; ++ib) {
        const uint8_t * yb = y + ib * k_y_block;
        const __m512i yq = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb + 2)));
        const __m512i corr = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, yq);  // offset x 4-value sums
        const uint8_t * wb = w + ib * W::block;
        for (int r = 0; r < 8; ++r) vnni::prefetch_ahead(wb + r * w_row_bytes);
        uint16_t d8[8];  // plain loads: a gather is slow where microcode guards it (GDS)
        for (int r = 0; r < 8; ++r) std::memcpy(&d8[r], wb + size_t(r) * w_row_bytes, 2);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(d8)));
        const __m512 ddw = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(f16(yb))));  // lanes 0-7
        for (int q = 0; q < 4; ++q) {
            const uint8_t * b0 = wb + size_t(2 * q) * w_row_bytes;
            const __m512i sum = _mm512_sub_epi32(
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), pair_values<W>(b0, b0 + w_row_bytes), yq), corr);
            acc[q] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ps.sel[q], ddw), _mm512_cvtepi32_ps(sum), acc[q]);
        }
    }
    float a[4][16];
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a[q], acc[q]);
    for (int r = 0; r < 8; ++r) out[r] = hsum8(a[r / 2] + (r % 2) * 8);
}

template <class W>
void product_rows(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * y,
                  int64_t M, float * dst, int64_t dst_stride, int ith, int nth) {
    const int64_t nb = K / k_qk;
    const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(type)->vec_dot;
    const auto ym = [&](int64_t m) { return y + m * nb * int64_t(k_y_block); };
    vnni::for_each_row_group(
        N, M, ith, nth,
        [&](int64_t n0, int64_t m) {
            rows8<W>(w + n0 * w_row_bytes, w_row_bytes, nb, ym(m), dst + m * dst_stride + n0);
        },
        [&](int64_t n, int64_t m) {  // the last rows: ggml's own dot product
            vec_dot(int(K), dst + m * dst_stride + n, 0, w + n * w_row_bytes, 0, ym(m), 0, 1);
        });
}

// A tile's weight rows unpacked once for all its column tiles: per row and block the 32 values
// as unsigned bytes, twice (both 256-bit halves of a zmm), and the block's scale as a float.
// In the thread's scratch (tile_scratch).
struct RowTile {
    uint8_t * q;  // [R][nb][64]
    float * d;    // [R][nb]
    RowTile(Slice & s, int64_t nb)
        : q(s.take<uint8_t>(size_t(k_rows * nb) * 64)), d(s.take<float>(size_t(k_rows * nb))) {}
    template <class W>
    void unpack(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb) {
        for (int r = 0; r < R; ++r)
            for (int64_t ib = 0; ib < nb; ++ib) {
                const uint8_t * b = w + r * w_row_bytes + ib * W::block;
                const __m256i v = W::values(b);
                _mm512_storeu_si512(&q[size_t(r * nb + ib) * 64], _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1));
                d[r * nb + ib] = f16(b);
            }
    }
};

// One tile: R weight rows (R <= k_rows) x k_cols activation rows c0..c0+7.
template <class W, int R>
void tile(const RowTile & rt, int64_t nb, const Packed & p, int64_t Mp, int64_t c0, float * out) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
    const vnni::PairSelect ps;  // lanes 0-7 take the pair's first row's scale, 8-15 the second's
    const uint8_t * yq = p.qs + (c0 / 2) * nb * 64;
    const int32_t * ys = p.sums + (c0 / 2) * nb * 16;
    for (int64_t ib = 0; ib < nb; ++ib) {
        const __m512 dy = _mm512_zextps256_ps512(_mm256_loadu_ps(p.d + ib * Mp + c0));
        for (int q = 0; q < 4; ++q) {
            const __m512i y = _mm512_loadu_si512(yq + (q * nb + ib) * 64);
            const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(ys + (q * nb + ib) * 16), W::offset_shift);
            const __m512 dq = _mm512_permutexvar_ps(ps.sel[q], dy);
            for (int r = 0; r < R; ++r) {
                const __m512 dd = _mm512_mul_ps(_mm512_set1_ps(rt.d[r * nb + ib]), dq);
                const __m512i sum = _mm512_sub_epi32(
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(&rt.q[size_t(r * nb + ib) * 64]), y),
                    corr);
                acc[r][q] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(sum), acc[r][q]);
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        float a[4][16];
        for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a[q], acc[r][q]);
        for (int c = 0; c < k_cols; ++c) out[c * k_rows + r] = hsum8(a[c / 2] + (c % 2) * 8);
    }
}

template <class W>
void product_tiles(const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed, int64_t M,
                   float * dst, int64_t dst_stride, int ith, int nth, Slice & scratch) {
    const int64_t nb = K / k_qk, Mp = padded_cols(M);
    const Packed p(const_cast<uint8_t *>(packed), nb, Mp);
    RowTile rt(scratch, nb);
    vnni::for_each_tile(
        N, M, dst, dst_stride, ith, nth,
        [&](int64_t n0, int R) { rt.unpack<W>(w + n0 * w_row_bytes, w_row_bytes, R, nb); },
        [&](auto R, int64_t c0, float * out) { tile<W, decltype(R)::value>(rt, nb, p, Mp, c0, out); });
}

template <class W>
void product_of(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
                int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice & scratch) {
    if (M < k_min_batch) return product_rows<W>(type, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
    product_tiles<W>(w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
}

void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
             int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice scratch) {
    if (type == GGML_TYPE_Q8_0)
        return product_of<Q8_0>(type, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
    product_of<Q5_0>(type, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
}

bool available() {
    return true;
}

#else

void product(ggml_type, const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int, int,
             Slice) {}

bool available() {
    return false;
}

#endif

bool supports(ggml_type type) {
    return type == GGML_TYPE_Q8_0 || type == GGML_TYPE_Q5_0;
}

// A thread's scratch: its tile's weight rows unpacked (RowTile; batches only).
SliceSize product_scratch(int64_t K, int64_t M) {
    const size_t blocks = size_t(k_rows * (K / k_qk));
    return M < k_min_batch ? SliceSize() : SliceSize().add<uint8_t>(blocks * 64).add<float>(blocks);
}

}  // namespace

const ProductKernel & q8_0_kernel() {
    static const ProductKernel k = {"q8_0",       k_min_batch,     available, supports, packed_bytes,
                                    pack_scratch, product_scratch, pack,      product};
    return k;
}

}  // namespace kvlab::kernels
