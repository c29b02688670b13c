// Helpers shared by kvlab's quantized product kernels (product_q4_1.cpp, product_q8_0.cpp, product_amx.cpp,
// product_vnni.cpp): the tile geometry and the loops that split a product over threads; the pieces of
// ggml's x86 dot products they reproduce to the bit, compiled where the CPU has AVX-512 (F, BW, VL) with
// VNNI (KVLAB_VNNI).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvlab::kernels::vnni {

// The decode kernels stream the weights (and the attention its K/V rows) once per token: each asks
// for the line 16 KiB ahead of what it reads, across 4 KiB boundaries where the hardware
// prefetchers stop (measured on an Intel Xeon, smollm2-135m decode at 512 tokens, 1 thread: 68 ->
// 75 tok/s with 16 KiB, less with 0.25 / 4 KiB, no gain at 32 KiB). Any CPU: a plain prefetch.
inline void prefetch_ahead(const uint8_t * p) {
    __builtin_prefetch(p + 16384, 0, 3);
}

constexpr int k_tile_rows = 4;  // weight rows per register tile
constexpr int k_tile_cols = 8;  // activation rows per tile: 4 pairs, one pair per zmm

inline int64_t padded_cols(int64_t M) {  // activation rows padded to whole tiles
    return (M + k_tile_cols - 1) / k_tile_cols * k_tile_cols;
}

// A batch product's loop: tiles of up to k_tile_rows weight rows split over nth threads; per tile
// unpack(n0, R) once, then for each tile of activation rows c0.. tile(R, c0, out), R a compile-time
// std::integral_constant, out[c * k_tile_rows + r] scattered into dst (rows past M dropped).
template <class Unpack, class Tile>
void for_each_tile(int64_t N, int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Unpack && unpack,
                   Tile && tile) {
    const int64_t n_tiles = (N + k_tile_rows - 1) / k_tile_rows, Mp = padded_cols(M);
    const int64_t t0 = n_tiles * ith / nth, t1 = n_tiles * (ith + 1) / nth;
    float out[k_tile_cols * k_tile_rows];
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * k_tile_rows;
        const int R = int(std::min<int64_t>(k_tile_rows, N - n0));
        unpack(n0, R);
        for (int64_t c0 = 0; c0 < Mp; c0 += k_tile_cols) {
            switch (R) {
                case 4:
                    tile(std::integral_constant<int, 4>{}, c0, out);
                    break;
                case 3:
                    tile(std::integral_constant<int, 3>{}, c0, out);
                    break;
                case 2:
                    tile(std::integral_constant<int, 2>{}, c0, out);
                    break;
                default:
                    tile(std::integral_constant<int, 1>{}, c0, out);
                    break;
            }
            const int nc = int(std::min<int64_t>(k_tile_cols, M - c0));
            for (int c = 0; c < nc; ++c)
                for (int r = 0; r < R; ++r) dst[(c0 + c) * dst_stride + n0 + r] = out[c * k_tile_rows + r];
        }
    }
}

// A small batch's loop (decode): per activation row m, groups of 8 weight rows split over nth
// threads; rows8(n0, m) for whole groups, one(n, m) for the rows of a last partial group.
template <class Rows8, class One>
void for_each_row_group(int64_t N, int64_t M, int ith, int nth, Rows8 && rows8, One && one) {
    const int64_t n_groups = (N + 7) / 8;
    const int64_t g0 = n_groups * ith / nth, g1 = n_groups * (ith + 1) / nth;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t g = g0; g < g1; ++g) {
            const int64_t n0 = g * 8;
            if (n0 + 8 <= N) {
                rows8(n0, m);
            } else {
                for (int64_t n = n0; n < N; ++n) one(n, m);
            }
        }
}

}  // namespace kvlab::kernels::vnni

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define KVLAB_VNNI 1
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvlab::kernels::vnni {

// ggml's hsum_float_8: (a4+a0, a5+a1, a6+a2, a7+a3) -> (h0+h2, h1+h3) -> g0+g1.
inline float hsum8(const float * a) {
    const float h0 = a[4] + a[0], h1 = a[5] + a[1], h2 = a[6] + a[2], h3 = a[7] + a[3];
    return (h0 + h2) + (h1 + h3);
}

inline float f16(const uint8_t * p) {  // exact, as ggml's table
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// 32 nibbles broadcast to every 128-bit lane of x, as bytes in each 256-bit half: bytes 0-15 the
// low nibbles, 16-31 the high ones (ggml's bytes_from_nibbles_32 order).
inline __m512i unpack_nibbles(__m512i x) {
    return _mm512_and_si512(_mm512_srlv_epi64(x, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
}

// Lane selectors for the 4 row pairs of a register tile: lanes 0-7 take element 2q, 8-15 2q + 1.
struct PairSelect {
    __m512i sel[4];
    PairSelect() {
        for (int q = 0; q < 4; ++q) {
            const int a = 2 * q, b = 2 * q + 1;
            sel[q] = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
        }
    }
};

}  // namespace kvlab::kernels::vnni

#endif
