#include "model/gemv_q8_0.h"

#include <algorithm>
#include <cstring>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "model/vnni.h"

namespace kvlab::gemv {

namespace {

constexpr int64_t k_qk = 32;      // values per block (QK8_0 = QK5_0)
constexpr size_t k_y_block = 34;  // block_q8_0: f16 d, 32 int8

}  // namespace

#ifdef KVLAB_VNNI

namespace {

using vnni::f16;
using vnni::hsum8;

// The weight types: a block's bytes, and the 32 values of two rows' blocks as unsigned bytes
// u = value + offset (lanes 0-31 the first row's, 32-63 the second's), for vpdpbusd; the offset
// times the activation's 4-value sums is taken off the integer sums, which stay exact.
struct Q8_0 {  // block_q8_0: f16 d, 32 int8
    static constexpr size_t block = 34;
    static constexpr int offset = 128;
    static __m512i pair(const uint8_t * b0, const uint8_t * b1) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b0 + 2));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b1 + 2));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(char(0x80)));
    }
};

struct Q5_0 {  // block_q5_0: f16 d, 32 high bits, 16 bytes of nibbles; value = (nibble | bit << 4) - 16
    static constexpr size_t block = 22;
    static constexpr int offset = 16;
    static __m512i pair(const uint8_t * b0, const uint8_t * b1) {
        const __m256i lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b0 + 6)));
        const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b1 + 6)));
        const __m512i nib = vnni::unpack_nibbles(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
        uint32_t h0, h1;  // bit j: the high bit of value j (ggml's bytes_from_bits_32)
        std::memcpy(&h0, b0 + 2, 4);
        std::memcpy(&h1, b1 + 2, 4);
        const __mmask64 k = __mmask64(h0) | (__mmask64(h1) << 32);
        return _mm512_or_si512(nib, _mm512_maskz_mov_epi8(k, _mm512_set1_epi8(0x10)));
    }
};

// 8 weight rows against the activation row y, two per zmm (the activation block in both halves).
// Per output and block, as ggml's vec_dot: the 32 products summed in 8 lanes of 4 consecutive
// values, acc = fma(d_w * d_y, float(sum), acc); the output is hsum8(acc).
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
        uint16_t d8[8];  // plain loads: a gather is slow where microcode guards it (GDS)
        for (int r = 0; r < 8; ++r) std::memcpy(&d8[r], wb + size_t(r) * w_row_bytes, 2);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(d8)));
        const __m512 ddw = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_set1_ps(f16(yb))));  // lanes 0-7
        for (int q = 0; q < 4; ++q) {
            const uint8_t * b0 = wb + size_t(2 * q) * w_row_bytes;
            const __m512i sum =
                _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), W::pair(b0, b0 + w_row_bytes), yq), corr);
            acc[q] = _mm512_fmadd_ps(_mm512_permutexvar_ps(ps.sel[q], ddw), _mm512_cvtepi32_ps(sum), acc[q]);
        }
    }
    float a[4][16];
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(a[q], acc[q]);
    for (int r = 0; r < 8; ++r) out[r] = hsum8(a[r / 2] + (r % 2) * 8);
}

template <class W>
void product_of(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * y,
                float * dst, int ith, int nth) {
    const int64_t nb = K / k_qk;
    const int64_t n_groups = (N + 7) / 8;
    const int64_t g0 = n_groups * ith / nth, g1 = n_groups * (ith + 1) / nth;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t n0 = g * 8;
        if (n0 + 8 <= N) {
            rows8<W>(w + n0 * w_row_bytes, w_row_bytes, nb, y, dst + n0);
        } else {  // the last rows: ggml's own dot product
            const ggml_vec_dot_t vec_dot = ggml_get_type_traits_cpu(type)->vec_dot;
            for (int64_t n = n0; n < N; ++n) vec_dot(int(K), dst + n, 0, w + n * w_row_bytes, 0, y, 0, 1);
        }
    }
}

}  // namespace

bool available() {
    return true;
}

void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * y,
             float * dst, int ith, int nth) {
    if (type == GGML_TYPE_Q8_0) return product_of<Q8_0>(type, w, w_row_bytes, K, N, y, dst, ith, nth);
    product_of<Q5_0>(type, w, w_row_bytes, K, N, y, dst, ith, nth);
}

#else

bool available() {
    return false;
}

void product(ggml_type, const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, float *, int, int) {}

#endif

bool applies(const ggml_tensor * w, const ggml_tensor * x) {
    return available() && (w->type == GGML_TYPE_Q8_0 || w->type == GGML_TYPE_Q5_0) && ggml_n_dims(w) == 2 &&
           w->ne[0] % k_qk == 0 && w->buffer && ggml_backend_buffer_is_host(w->buffer) && !w->extra &&
           x->type == GGML_TYPE_F32 && x->ne[1] == 1 && x->ne[2] == 1 && x->ne[3] == 1 && x->ne[0] == w->ne[0] &&
           x->nb[0] == sizeof(float);
}

ggml_tensor * mul_mat_row(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    const int64_t bytes = x->ne[0] / k_qk * int64_t(k_y_block);
    ggml_tensor * src[1] = {x};
    ggml_tensor * y = ggml_custom_4d(
        ctx, GGML_TYPE_I8, bytes, 1, 1, 1, src, 1,
        [](ggml_tensor * dst, int ith, int, void *) {  // ggml's own quantize_row_q8_0: ggml's bytes
            if (ith != 0) return;
            const ggml_tensor * xs = dst->src[0];
            ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)
                ->from_float(static_cast<const float *>(xs->data), dst->data, xs->ne[0]);
        },
        1, nullptr);
    ggml_tensor * args[2] = {w, y};
    return ggml_custom_4d(
        ctx, GGML_TYPE_F32, w->ne[1], 1, 1, 1, args, 2,
        [](ggml_tensor * dst, int ith, int nth, void *) {
            const ggml_tensor * wt = dst->src[0];
            product(wt->type, static_cast<const uint8_t *>(wt->data), wt->nb[1], wt->ne[0], wt->ne[1],
                    static_cast<const uint8_t *>(dst->src[1]->data), static_cast<float *>(dst->data), ith, nth);
        },
        GGML_N_TASKS_MAX, nullptr);
}

}  // namespace kvlab::gemv
