// The block order by AVX-512 VNNI (block_order.h): the activations quantized and packed (pack),
// and per block the exact integer sums of 16 weight rows by VPDPBUSD: for fewer than k_min_batch
// activation rows (rows_vnni, rows_panel: decode, under both kernels) and for batches
// (panel_vnni: vnni_kernel(), and Q6_K under amx_kernel()). vnni_kernel() runs them at every
// batch size (CPUs without AMX: AMD Zen 4/5, Intel from Ice Lake).

// GCC 12 reads the self-initialized value of _mm512_undefined_*() inside the intrinsics as
// "maybe uninitialized" once they are inlined here: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>

#include "kernels/block_order.h"
#include "kernels/products.h"

namespace kvlab::kernels::block {

#ifdef KVLAB_BLOCK_VNNI

namespace {

// ggml's quantize_row_q8_1 (ggml-cpu/arch/x86/quants.c) for one block, written where this
// kernel reads it: the same operations on every value (max |x| exact in any order, d = max / 127
// and id = 127 / max in float, x * id rounded to nearest even, d and d * sum(q) rounded to f16),
// so the same bytes, 16 values per instruction instead of 8. quantize_row_q8_0 takes the same
// steps for the values and d; *q is sum(q), *h the sum of the first 16, exact.
inline void quantize_block(const float * x, int8_t * qs, float * d, float * s, int32_t * q, int32_t * h) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float dv = max / 127.f;
    const float id = max != 0.0f ? 127.f / max : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(qs), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(qs + 16), _mm512_cvtsepi32_epi8(i1));
    const int first = _mm512_reduce_add_epi32(i0);
    const int sum = first + _mm512_reduce_add_epi32(i1);
    *d = _cvtsh_ss(_cvtss_sh(dv, _MM_FROUND_TO_NEAREST_INT));
    *s = _cvtsh_ss(_cvtss_sh(dv * float(sum), _MM_FROUND_TO_NEAREST_INT));
    *q = sum;
    *h = first;
}

}  // namespace

// Rows in contiguous ranges per thread (the d, s and q arrays are [block][row]: interleaved rows
// would share their cache lines between threads).
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth, Slice) {
    const int64_t nb = K / k_qk, Mp = padded_rows(M);
    int8_t * qs = reinterpret_cast<int8_t *>(packed);
    float * d = reinterpret_cast<float *>(packed + Mp * K);
    float * s = d + nb * Mp;
    int32_t * q = reinterpret_cast<int32_t *>(s + nb * Mp);
    int32_t * h = q + nb * Mp;
    for (int64_t m = Mp * ith / nth; m < Mp * (ith + 1) / nth; ++m) {
        if (m >= M) {
            std::memset(qs + m * K, 0, size_t(K));
            for (int64_t ib = 0; ib < nb; ++ib)
                d[ib * Mp + m] = s[ib * Mp + m] = 0.0f, q[ib * Mp + m] = h[ib * Mp + m] = 0;
            continue;
        }
        for (int64_t ib = 0; ib < nb; ++ib)
            quantize_block(x + m * x_stride + ib * k_qk, qs + m * K + ib * k_qk, &d[ib * Mp + m], &s[ib * Mp + m],
                           &q[ib * Mp + m], &h[ib * Mp + m]);
    }
}

namespace {

// The two half sums of one activation row's block (a: its 32 int8 values) against the 16 weight
// rows' values q: two chains of 4 VNNI instructions (16 rows x 4 values each).
inline void half_sums(const __m512i (&q)[8], const int8_t * a, __m512i & s0, __m512i & s1) {
    int32_t g4[8];
    std::memcpy(g4, a, 32);
    s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_set1_epi32(g4[0]));
    s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[4], _mm512_set1_epi32(g4[4]));
    for (int g = 1; g < 4; ++g) {
        s0 = _mm512_dpbusd_epi32(s0, q[g], _mm512_set1_epi32(g4[g]));
        s1 = _mm512_dpbusd_epi32(s1, q[g + 4], _mm512_set1_epi32(g4[g + 4]));
    }
}

// Block ib's step for each of M (< k_min_batch) activation rows against 16 weight rows (q: the
// block's values as W::values gives them), its sums by VNNI (half_sums).
template <class W>
inline void block_rows(const __m512i (&q)[8], __m512 dw, __m512 mw, const Packed & y, int64_t M, int64_t K, int64_t ib,
                       __m512 * acc) {
    for (int64_t mrow = 0; mrow < M; ++mrow) {
        __m512i s0, s1;
        half_sums(q, y.qs + mrow * K + ib * k_qk, s0, s1);
        const int64_t i = ib * M + mrow;
        acc[mrow] = step<W>(acc[mrow], s0, s1, dw, mw, y.d[i], y.s[i], y.q[i], y.h[i]);
    }
}

}  // namespace

// Fewer than k_min_batch activation rows (decode) against 16 weight rows: each block unpacked
// into registers once for all rows, its sums by VNNI (8 instructions of 16 rows x 4 values).
template <class W>
void rows_vnni(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb, const Packed & y, int64_t M, int64_t K,
               float * dst, int64_t dst_stride) {
    __m512 acc[k_min_batch];
    for (int64_t mrow = 0; mrow < M; ++mrow) acc[mrow] = _mm512_setzero_ps();
    for_each_block<W>(w, w_row_bytes, R, nb, [&](int64_t ib, const __m512i(&q)[8], const Scalars & s) {
        const __m512 dw = s.d(), mw = W::minima ? s.m() : _mm512_setzero_ps();
        block_rows<W>(q, dw, mw, y, M, K, ib, acc);
    });
    for (int64_t mrow = 0; mrow < M; ++mrow) store(dst + mrow * dst_stride, acc[mrow], R);
}

// rows_vnni over a panel of packed weights (16 rows, panel_bytes of them): the same operations on
// the same values. The panel's bytes are read front to back; each block asks for the lines 16 KiB
// ahead of its share of them (vnni::prefetch_ahead: the hardware prefetchers stop at 4 KiB pages).
template <class W>
void rows_panel(const uint8_t * panel, size_t panel_bytes, int64_t nb, const Packed & y, int64_t M, int64_t K,
                float * dst, int64_t dst_stride) {
    __m512 acc[k_min_batch];
    for (int64_t mrow = 0; mrow < M; ++mrow) acc[mrow] = _mm512_setzero_ps();
    size_t ahead = 0;
    for (int64_t ib = 0; ib < nb; ++ib) {
        for (const size_t end = panel_bytes * size_t(ib + 1) / size_t(nb); ahead < end; ahead += 64)
            vnni::prefetch_ahead(panel + ahead);
        __m512i q[8];
        __m512 dw, mw;
        panel_block_of<W>(panel, ib, q, dw, mw);
        block_rows<W>(q, dw, mw, y, M, K, ib, acc);
    }
    for (int64_t mrow = 0; mrow < M; ++mrow) _mm512_storeu_ps(dst + mrow * dst_stride, acc[mrow]);
}

namespace {

// A panel against T activation rows m0.. by AVX-512 VNNI (the batch path where there are no AMX
// tiles, or --products vnni, or Q6_K): per block, the panel's 8 vectors loaded once for the T rows,
// each row's exact half sums (half_sums: integers, any order gives the same values), then the same
// step as rows_vnni and the tiles: the same bits.
template <class W, int T>
void tile_vnni(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, int64_t m0, float * dst,
               int64_t dst_stride, int R) {
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    const int8_t * rows = y.qs + m0 * K;
    for (int64_t ib = 0; ib < nb; ++ib) {
        const uint8_t * b = &p.q[size_t(ib) * 512];
        __m512i q[8];
        for (int g = 0; g < 8; ++g) q[g] = _mm512_loadu_si512(b + g * 64);
        const __m512 dw = _mm512_load_ps(&p.d[ib * k_panel]);
        const __m512 mw = W::minima || W::halves ? _mm512_load_ps(&p.m[ib * k_panel]) : _mm512_setzero_ps();
        const int64_t i = ib * Mp + m0;
        for (int t = 0; t < T; ++t) {
            __m512i s0, s1;
            half_sums(q, rows + t * K + ib * k_qk, s0, s1);
            acc[t] = step<W>(acc[t], s0, s1, dw, mw, y.d[i + t], y.s[i + t], y.q[i + t], y.h[i + t]);
        }
    }
    for (int t = 0; t < T; ++t) store(dst + (m0 + t) * dst_stride, acc[t], R);
}

constexpr int k_vnni_rows = 8;  // activation rows per VNNI tile: 8 accumulators beside the 8 weight vectors

template <class W, int T = k_vnni_rows>
void tail_vnni(int rest, const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, int64_t m0, float * dst,
               int64_t dst_stride, int R) {
    if constexpr (T > 1) {
        if (rest < T) return tail_vnni<W, T - 1>(rest, p, nb, y, Mp, K, m0, dst, dst_stride, R);
    }
    tile_vnni<W, T>(p, nb, y, Mp, K, m0, dst, dst_stride, R);
}

}  // namespace

template <class W>
void panel_vnni(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, int64_t M, float * dst,
                int64_t dst_stride, int R) {
    int64_t m0 = 0;
    for (; m0 + k_vnni_rows <= M; m0 += k_vnni_rows) tile_vnni<W, k_vnni_rows>(p, nb, y, Mp, K, m0, dst, dst_stride, R);
    if (m0 < M) tail_vnni<W>(int(M - m0), p, nb, y, Mp, K, m0, dst, dst_stride, R);
}

// The weight types each loop runs (product_with): rows_vnni those read from the GGUF layout.
using RowsVnni = void(const uint8_t *, size_t, int, int64_t, const Packed &, int64_t, int64_t, float *, int64_t);
using RowsPanel = void(const uint8_t *, size_t, int64_t, const Packed &, int64_t, int64_t, float *, int64_t);
using PanelVnni = void(const Panel &, int64_t, const Packed &, int64_t, int64_t, int64_t, float *, int64_t, int);
template RowsVnni rows_vnni<Q4_1>;
template RowsVnni rows_vnni<Q5_0>;
template RowsVnni rows_vnni<Q8_0>;
template RowsPanel rows_panel<Q4_1>;
template RowsPanel rows_panel<Q5_0>;
template RowsPanel rows_panel<Q8_0>;
template RowsPanel rows_panel<Q4_K>;
template RowsPanel rows_panel<Q6_K>;
template PanelVnni panel_vnni<Q4_1>;
template PanelVnni panel_vnni<Q5_0>;
template PanelVnni panel_vnni<Q8_0>;
template PanelVnni panel_vnni<Q4_K>;
template PanelVnni panel_vnni<Q6_K>;

bool rows_available() {
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bitalg");
}

#else

bool rows_available() {
    return false;
}

void pack(const float *, int64_t, int64_t, int64_t, uint8_t *, int, int, Slice) {}

#endif

}  // namespace kvlab::kernels::block

namespace kvlab::kernels {

bool amx_rows_available() {
    return block::rows_available();
}

const ProductKernel & vnni_kernel(bool panels) {
    using namespace block;
    static const ProductKernel k = {
        "vnni", k_min_batch,          rows_available, supports, packed_bytes, pack_scratch, product_scratch<false>,
        pack,   product<false, false>};
    static const ProductKernel kp = {
        "vnni", k_min_batch,         rows_available, panel_supports, packed_bytes, pack_scratch, product_scratch<false>,
        pack,   product<false, true>};
    return panels ? kp : k;
}

}  // namespace kvlab::kernels
