// Helpers shared by kvlab's quantized product kernels (gemm_q4_1.cpp, gemm_q8_0.cpp): the pieces
// of ggml's x86 dot products they reproduce to the bit. Compiled where the CPU has AVX-512 (F,
// BW, VL) with VNNI; KVLAB_VNNI says so.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define KVLAB_VNNI 1
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvlab::vnni {

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

// The row kernels (decode) stream the weights once per token: each of the 8 rows in flight asks
// for the line 16 KiB ahead of the block it reads, across 4 KiB boundaries where the hardware
// prefetchers stop (measured on an Intel Xeon, smollm2-135m decode at 512 tokens, 1 thread: 68 ->
// 75 tok/s with 16 KiB, less with 0.25 / 4 KiB, no gain at 32 KiB).
inline void prefetch_ahead(const uint8_t * p) {
    _mm_prefetch(reinterpret_cast<const char *>(p + 16384), _MM_HINT_T0);
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

}  // namespace kvlab::vnni

#endif
