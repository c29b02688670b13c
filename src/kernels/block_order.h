// kvlab's block order: its own arithmetic for the products of Q4_1, Q5_0 and Q8_0 weights (and,
// from panels, Q4_K and Q6_K: see block_types.h):
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
// bits whatever the batch size, the chunk or the thread count. Two kernels: amx_kernel()
// (product_amx.cpp: the tiles for batches) and vnni_kernel() (product_vnni.cpp: VNNI for every
// batch size: CPUs without AMX, AMD Zen 4/5).
// How each weight type's blocks become the kernels' bytes and scales: block_types.h.
//
// This header holds what both kernels share: the packed activations, the weight panel unpacked
// for a batch, the per-block step, the VNNI loops (product_vnni.cpp: the AMX kernel's decode rows
// and Q6_K batches) and the product over a thread's panels (product_with, product_amx.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/block_types.h"
#include "kernels/products.h"

// The block order on AVX-512 VNNI (pack, and the products of fewer than k_min_batch rows) needs
// VNNI and BITALG (Intel from Ice Lake, AMD from Zen 4); the AMX tiles (batches) need AMX-INT8.
#if defined(KVLAB_VNNI) && defined(__AVX512BITALG__)
#define KVLAB_BLOCK_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KVLAB_AMX 1
#endif
#endif

namespace kvlab::kernels::block {

constexpr int64_t k_min_batch = 16;  // activation rows from which the AMX tiles run; below, AVX-512 VNNI
constexpr int k_panel = 16;          // weight rows per panel: one AMX tile's columns, one zmm's lanes
constexpr int k_rows = 16;           // activation rows per AMX tile

inline int64_t padded_rows(int64_t M) {
    return M < k_min_batch ? M : (M + k_rows - 1) / k_rows * k_rows;
}

// The packed activations, M rows padded to Mp (padded_rows), nb blocks each:
//   qs: [Mp][K] int8, a row's blocks' values end to end (an AMX tile reads 16 rows x 32 bytes)
//   d, s: [nb][Mp] float: the blocks' f16 scale and (Q8_1) f16 sum, converted; 0 in padded rows
//   q: [nb][Mp] int32: the exact sum of the block's 32 int8 values
//   h: [nb][Mp] int32: the exact sum of its first 16 (Q6_K's two scales per block)
struct Packed {
    const int8_t * qs;
    const float * d;
    const float * s;
    const int32_t * q;
    const int32_t * h;
    Packed(const uint8_t * p, int64_t K, int64_t Mp)
        : qs(reinterpret_cast<const int8_t *>(p)),
          d(reinterpret_cast<const float *>(p + Mp * K)),
          s(d + K / k_qk * Mp),
          q(reinterpret_cast<const int32_t *>(s + K / k_qk * Mp)),
          h(q + K / k_qk * Mp) {}
};

inline bool supports(ggml_type type) {
    return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0;
}

// The K-quants (256-value super-blocks) run only from panels (pack_panels).
inline bool kquant(ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
}

inline bool panel_supports(ggml_type type) {
    return supports(type) || kquant(type);
}

inline size_t packed_bytes(int64_t K, int64_t M) {
    const int64_t Mp = padded_rows(M);
    return size_t(Mp * K + 4 * (K / k_qk) * Mp * int64_t(sizeof(float)));
}

// Whether the block order runs here by VNNI (product_vnni.cpp): AVX-512 VNNI and BITALG.
bool rows_available();
// The activations quantized and packed for both kernels (ProductKernel::pack; product_vnni.cpp):
// no scratch.
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth, Slice);
inline SliceSize pack_scratch(int64_t, int64_t) {
    return {};
}

// A thread's scratch in a product of k_min_batch rows or more: the panel being multiplied
// unpacked (Panel), and with the tiles two buffers of block sums (PanelProduct).
constexpr int64_t k_unit_blocks = 8;  // blocks per unit of PanelProduct
constexpr size_t k_unit_sums = size_t(k_unit_blocks) * k_rows * 16;
template <bool Tiles>
SliceSize product_scratch(int64_t K, int64_t M) {
    if (M < k_min_batch) return {};
    const size_t nb = size_t(K / k_qk);
    SliceSize s = SliceSize().add<uint8_t>(nb * 512).add<float>(nb * k_panel).add<float>(nb * k_panel);
    return Tiles ? s.add<int32_t>(k_unit_sums).add<int32_t>(k_unit_sums) : s;
}

#ifdef KVLAB_BLOCK_VNNI

// A panel of 16 weight rows unpacked for the AMX tiles: per block the 8 vectors end to end (one
// B tile), and the rows' scales and minima (Q6_K: second halves' scales), [nb][16] each.
// In the thread's scratch (product_scratch).
struct Panel {
    uint8_t * q;   // [nb][8][64]
    float *d, *m;  // [nb][16]

    Panel(Slice & s, int64_t nb)
        : q(s.take<uint8_t>(size_t(nb) * 512)),
          d(s.take<float>(size_t(nb) * k_panel)),
          m(s.take<float>(size_t(nb) * k_panel)) {}

    template <class W>
    void unpack(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb) {
        for_each_block<W>(w, w_row_bytes, R, nb, [&](int64_t ib, const __m512i(&v)[8], const Scalars & s) {
            for (int g = 0; g < 8; ++g) _mm512_storeu_si512(&q[size_t(ib) * 512 + g * 64], v[g]);
            _mm512_store_ps(&d[ib * k_panel], s.d());
            _mm512_store_ps(&m[ib * k_panel], s.m());
        });
    }

    // The same from a panel of packed weights (pack_panels_of).
    template <class W>
    void unpack_panel(const uint8_t * panel, int64_t nb) {
        for (int64_t ib = 0; ib < nb; ++ib) {
            __m512i v[8];
            __m512 dw, mw;
            panel_block_of<W>(panel, ib, v, dw, mw);
            for (int g = 0; g < 8; ++g) _mm512_storeu_si512(&q[size_t(ib) * 512 + g * 64], v[g]);
            _mm512_store_ps(&d[ib * k_panel], dw);
            _mm512_store_ps(&m[ib * k_panel], mw);
        }
    }
};

// The per-block step every output takes, from the block's integer sum of u8 x int8 (one lane per
// weight row): sum -= offset * q_y (exact), acc = fma(d_w * d_y, float(sum), acc), then for Q4_1
// acc = fma(m_w, s_y, acc).
template <class W>
inline __m512 step(__m512 acc, __m512i sum, __m512 dw, __m512 mw, float dy, float sy, int32_t qy) {
    if constexpr (W::offset != 0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(W::offset * qy));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(sum), acc);
    if constexpr (W::minima) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sy), acc);
    return acc;
}

// The same from the block's two half sums (values 0-15 and 16-31; hy: the activations' exact sum
// of their first 16). Q6_K (halves): each half's offset taken off, then acc = fma(d_w * d_y,
// float(s0), acc), acc = fma(d2_w * d_y, float(s1), acc), d2_w (in mw) the second half's scale;
// the other types add the halves (exact) and take the step above.
template <class W>
inline __m512 step(__m512 acc, __m512i s0, __m512i s1, __m512 dw, __m512 mw, float dy, float sy, int32_t qy,
                   int32_t hy) {
    if constexpr (W::halves) {
        s0 = _mm512_sub_epi32(s0, _mm512_set1_epi32(W::offset * hy));
        s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(W::offset * (qy - hy)));
        const __m512 y = _mm512_set1_ps(dy);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, y), _mm512_cvtepi32_ps(s0), acc);
        return _mm512_fmadd_ps(_mm512_mul_ps(mw, y), _mm512_cvtepi32_ps(s1), acc);
    } else {
        return step<W>(acc, _mm512_add_epi32(s0, s1), dw, mw, dy, sy, qy);
    }
}

inline void store(float * dst, __m512 v, int R) {
    _mm512_mask_storeu_ps(dst, __mmask16((1u << R) - 1), v);
}

// The VNNI loops (product_vnni.cpp, instantiated there for the weight types that reach them).
// Fewer than k_min_batch activation rows (decode) against 16 weight rows: each block unpacked
// into registers once for all rows, its sums by VNNI (8 instructions of 16 rows x 4 values).
template <class W>
void rows_vnni(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb, const Packed & y, int64_t M, int64_t K,
               float * dst, int64_t dst_stride);
// rows_vnni over a panel of packed weights (16 rows, panel_bytes of them): the same operations on
// the same values. The panel's bytes are read front to back; each block asks for the lines 16 KiB
// ahead of its share of them (vnni::prefetch_ahead: the hardware prefetchers stop at 4 KiB pages).
template <class W>
void rows_panel(const uint8_t * panel, size_t panel_bytes, int64_t nb, const Packed & y, int64_t M, int64_t K,
                float * dst, int64_t dst_stride);
// A panel against M (k_min_batch or more) activation rows by VNNI, in tiles of 8 rows.
template <class W>
void panel_vnni(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, int64_t M, float * dst,
                int64_t dst_stride, int R);

// The product of one thread's share of the weight panels (product_amx.cpp). tiles: batches of
// k_min_batch rows and more on the AMX tiles (amx_kernel), else by VNNI (vnni_kernel); panels: w
// packed into panels (pack_panels_of; N a multiple of 16).
void product_with(bool tiles, bool panels, ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N,
                  const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith, int nth,
                  Slice & scratch);

template <bool Tiles, bool Panels>
void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
             int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice scratch) {
    product_with(Tiles, Panels, type, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
}

#else

template <bool Tiles, bool Panels>
void product(ggml_type, const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int, int,
             Slice) {}

#endif

}  // namespace kvlab::kernels::block
