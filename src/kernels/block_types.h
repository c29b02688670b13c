// The weight types of kvlab's block order (block_order.h): how the blocks of 16 weight rows of each
// type become what the kernels multiply: per block of 32 values, 8 vectors of unsigned bytes
// (value + the type's offset; vector g holds values 4g..4g+3 of the 16 rows, one row per 32-bit
// lane, the layout of an AMX B tile and what VNNI multiplies by 4 broadcast activation values),
// the 16 rows' scales and their minima (or, for Q6_K, the scales of the blocks' second halves).
// Read from the GGUF layout (Q4_1, Q5_0, Q8_0) or from the panels the weights are rewritten into
// (pack_panels_of, pack_kquant_panels: Q4_K and Q6_K only from panels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/products.h"
#include "kernels/vnni.h"

#if defined(KVLAB_VNNI) && defined(__AVX512BITALG__)

namespace kvlab::kernels::block {

// The 16 bytes at `at` in each of 16 rows' blocks (b: row 0's block; rows past R read as zero),
// transposed: o[g] lane n = dword g of row n. With prefetch, each row's block also asks for the
// line 16 KiB ahead (vnni::prefetch_ahead).
inline void row_dwords(const uint8_t * b, size_t w_row_bytes, int R, size_t at, bool prefetch, __m512i (&o)[4]) {
    // dword g of 4 rows' 16 bytes (one row per 128-bit lane) -> lane g: dword g of the 4 rows
    const __m512i tr = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    __m512i z[4];
    for (int j = 0; j < 4; ++j) {
        __m128i lane[4];
        for (int r = 0; r < 4; ++r) {
            const int n = 4 * j + r;
            if (n < R) {
                const uint8_t * row = b + size_t(n) * w_row_bytes;
                if (prefetch) vnni::prefetch_ahead(row);
                lane[r] = _mm_loadu_si128(reinterpret_cast<const __m128i *>(row + at));
            } else {
                lane[r] = _mm_setzero_si128();
            }
        }
        const __m512i v = _mm512_inserti32x4(
            _mm512_inserti32x4(_mm512_inserti32x4(_mm512_zextsi128_si512(lane[0]), lane[1], 1), lane[2], 2), lane[3],
            3);
        z[j] = _mm512_permutexvar_epi32(tr, v);
    }
    const __m512i lo01 = _mm512_shuffle_i32x4(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i lo23 = _mm512_shuffle_i32x4(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i hi01 = _mm512_shuffle_i32x4(z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i hi23 = _mm512_shuffle_i32x4(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2));
    o[0] = _mm512_shuffle_i32x4(lo01, lo23, _MM_SHUFFLE(2, 0, 2, 0));
    o[1] = _mm512_shuffle_i32x4(lo01, lo23, _MM_SHUFFLE(3, 1, 3, 1));
    o[2] = _mm512_shuffle_i32x4(hi01, hi23, _MM_SHUFFLE(2, 0, 2, 0));
    o[3] = _mm512_shuffle_i32x4(hi01, hi23, _MM_SHUFFLE(3, 1, 3, 1));
}

// 16 bytes of nibbles per row (o from row_dwords) -> values 4g.. (low nibbles of dword g) and
// 16 + 4g.. (high nibbles).
inline void nibbles(const __m512i (&o)[4], __m512i (&q)[8]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
        q[g] = _mm512_and_si512(o[g], low);
        q[g + 4] = _mm512_and_si512(_mm512_srli_epi16(o[g], 4), low);
    }
}

// What a block holds besides its values, for 16 rows (rows past R zero): a[n] the first 4 bytes
// of row n's block (its f16 scale, then Q4_1's f16 minimum), h[n] Q5_0's 32 high bits. Read by
// plain loads and stores a block ahead of their use: a vector load right after 16 narrow stores to
// its bytes would wait for them all (store forwarding fails; a gather is slow where microcode
// guards it, GDS).
struct Scalars {
    alignas(64) uint32_t a[16];
    alignas(64) uint32_t h[16];

    template <class W>
    void read(const uint8_t * b, size_t w_row_bytes, int R) {
        for (int n = 0; n < 16; ++n) {
            if (n < R) {
                const uint8_t * row = b + size_t(n) * w_row_bytes;
                std::memcpy(&a[n], row, 4);
                if constexpr (W::high_bits) std::memcpy(&h[n], row + 2, 4);
            } else {
                a[n] = h[n] = 0;
            }
        }
    }
    // the 16 rows' scales (the low halves of a) and minima (the high halves)
    __m512 d() const { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_load_si512(a))); }
    __m512 m() const { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_load_si512(a), 16))); }
};

// A panel block's 4 vectors of nibble dwords (Q4_1, Q5_0 in panels) -> the values, as nibbles().
inline void panel_nibbles(const uint8_t * pb, __m512i (&q)[8]) {
    const __m512i o[4] = {_mm512_loadu_si512(pb), _mm512_loadu_si512(pb + 64), _mm512_loadu_si512(pb + 128),
                          _mm512_loadu_si512(pb + 192)};
    nibbles(o, q);
}

// The weight types: a block's bytes, the offset added to its values, whether it has minima and
// high bits (halves, super: see Q6_K and Q4_K below); values(): the 32 values of 16 rows' blocks (b: row 0's; s: their
// scalars) as 8 vectors, vector g holding values 4g..4g+3 of rows 0..15 as u8 = value + offset (lane n: row n), the
// layout of an AMX B tile and what VNNI multiplies by an activation's 4 values broadcast.
struct Q4_1 {  // block_q4_1: f16 d, f16 m, 16 bytes of nibbles; value = nibble * d + m
    static constexpr size_t block = 20;
    static constexpr int offset = 0;
    static constexpr bool minima = true, high_bits = false, halves = false, super = false;
    static constexpr int at = 4, n_raw = 4;  // the values' bytes in a block; raw vectors per panel block
    static constexpr size_t h_at = 0, d_at = 256, m_at = 288;  // in a panel block (see Panels)
    static void values(const uint8_t * b, size_t w_row_bytes, int R, const Scalars &, __m512i (&q)[8]) {
        __m512i o[4];
        row_dwords(b, w_row_bytes, R, at, true, o);
        nibbles(o, q);
    }
    static void raw(const uint8_t * b, size_t w_row_bytes, const Scalars & s, __m512i (&o)[8]) {
        row_dwords(b, w_row_bytes, 16, at, false, reinterpret_cast<__m512i(&)[4]>(o));
    }
    static void panel_values(const uint8_t * pb, __m512i (&q)[8]) { panel_nibbles(pb, q); }
};

// Q5_0's high bits (hv: the 16 rows' 32 bits) into the nibbles q: byte i of lane n of q[g] gets
// bit 4g + i of row n's high bits: two rows' h per 64-bit lane, so bytes 4..7 of a lane take
// bits 32 + 4g + i - 4 (the odd row's).
inline void add_high_bits(__m512i hv, __m512i (&q)[8]) {
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    for (int g = 0; g < 8; ++g) {
        const uint64_t lo = 0x03020100u + 0x04040404u * uint64_t(g);
        const __mmask64 k = _mm512_bitshuffle_epi64_mask(hv, _mm512_set1_epi64(int64_t(lo | (lo + 0x20202020u) << 32)));
        q[g] = _mm512_mask_add_epi8(q[g], k, q[g], bit4);  // the nibble + 16: its bit 4 set
    }
}

struct Q5_0 {  // block_q5_0: f16 d, 32 high bits, 16 bytes of nibbles; value = (nibble | bit << 4) - 16
    static constexpr size_t block = 22;
    static constexpr int offset = 16;
    static constexpr bool minima = false, high_bits = true, halves = false, super = false;
    static constexpr int at = 6, n_raw = 4;
    static constexpr size_t h_at = 256, d_at = 320, m_at = 0;
    static void values(const uint8_t * b, size_t w_row_bytes, int R, const Scalars & s, __m512i (&q)[8]) {
        __m512i o[4];
        row_dwords(b, w_row_bytes, R, at, true, o);
        nibbles(o, q);
        add_high_bits(_mm512_load_si512(s.h), q);
    }
    static void raw(const uint8_t * b, size_t w_row_bytes, const Scalars & s, __m512i (&o)[8]) {
        row_dwords(b, w_row_bytes, 16, at, false, reinterpret_cast<__m512i(&)[4]>(o));
    }
    static void panel_values(const uint8_t * pb, __m512i (&q)[8]) {
        panel_nibbles(pb, q);
        add_high_bits(_mm512_loadu_si512(pb + h_at), q);
    }
};

struct Q8_0 {  // block_q8_0: f16 d, 32 int8
    static constexpr size_t block = 34;
    static constexpr int offset = 128;
    static constexpr bool minima = false, high_bits = false, halves = false, super = false;
    static constexpr int n_raw = 8;
    static constexpr size_t h_at = 0, d_at = 512, m_at = 0;
    static void values(const uint8_t * b, size_t w_row_bytes, int R, const Scalars &, __m512i (&q)[8]) {
        const __m512i flip = _mm512_set1_epi8(char(0x80));
        __m512i lo[4], hi[4];
        row_dwords(b, w_row_bytes, R, 2, true, lo);
        row_dwords(b, w_row_bytes, R, 18, false, hi);
        for (int g = 0; g < 4; ++g) {
            q[g] = _mm512_xor_si512(lo[g], flip);
            q[g + 4] = _mm512_xor_si512(hi[g], flip);
        }
    }
    static void raw(const uint8_t * b, size_t w_row_bytes, const Scalars & s, __m512i (&o)[8]) {
        values(b, w_row_bytes, 16, s, o);
    }
    static void panel_values(const uint8_t * pb, __m512i (&q)[8]) {
        for (int g = 0; g < 8; ++g) q[g] = _mm512_loadu_si512(pb + 64 * g);
    }
};

// Weights rewritten in place into 16-row panels (--products amx|vnni, kvlab::Model): panel p (rows
// 16p..16p+15) starts where its first row did, and holds per block ib, in 16 x the block's bytes
// (panel block ib at 16 * ib * W::block): the values as the kernels read them (W::n_raw vectors
// of 16 rows' dwords: Q4_1's and Q5_0's nibble bytes, Q8_0's values + 128), then the rows' f16
// scales (d_at), Q4_1's f16 minima (m_at), Q5_0's high bits (h_at). The same bytes as the blocks,
// read as 64-byte vectors in order instead of gathered from 16 rows: the same products, bit for bit.
template <class W>
inline const uint8_t * panel_block(const uint8_t * panel, int64_t ib) {
    return panel + size_t(ib) * 16 * W::block;
}

// 16 f16 values at p (the 16 rows' scales or minima) as floats.
inline __m512 f16x16(const uint8_t * p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}

template <class W>
inline __m512 panel_d(const uint8_t * pb) {
    return f16x16(pb + W::d_at);
}

template <class W>
inline __m512 panel_m(const uint8_t * pb) {
    return f16x16(pb + W::m_at);
}

// The K-quants, only in panels: a 256-value super-block of 16 rows rewritten in place, in the same
// bytes, as 8 blocks of 32 values with what each block's step needs; every block's step is that of
// a 32-value type, so every path of the block order (decode rows and VNNI batches in
// product_vnni.cpp, Q4_K on the AMX tiles in product_amx.cpp) runs them.
//   Q4_K: value = d sc_j q - dmin m_j (sub-block j of 32, 6-bit sc_j and m_j): a Q4_1 block with
//         scale d sc_j and minimum -dmin m_j, both exact floats (11-bit x 6-bit), so the step is
//         Q4_1's. Panel super-block: f16 d [16], f16 dmin [16] at 32, the 12 scale bytes of the
//         16 rows transposed [12][16] at 64, then per block 256 nibble bytes as Q4_1's panels.
//   Q6_K: value = d sc_k (q - 32), q 6-bit, sc_k an int8 per 16 values: per block two integer sums
//         (values 0-15 and 16-31, each exact, its offset taken off with the activations' exact sum
//         of those 16) and two steps, scales d sc_2j and d sc_2j+1 (halves). Panel super-block:
//         f16 d [16], int8 scales [16][16] (transposed) at 32, then per block 256 nibble bytes (q's
//         low 4 bits) and 128 bytes of q's 2 high bits (byte t of row n's dword in vector k: 4
//         fields of 2 bits, field f those of value 4 (4k + f) + t: one shift and one ternary op put
//         them under the nibbles of values 4g.., g = 4k + f).
// Each super-block's bytes are read front to back (the scales first, then block after block):
// one sequential stream per panel, as the 32-value types' panels.
// Their bytes are unpacked once, when the panels are packed, through their plain layouts
// (ggml-common.h's block_q4_K and block_q6_K, dequantize_row_q4_K / _q6_K's value order).
inline void store_nibbles(const uint8_t (&v)[16][256], int j, uint8_t * out) {  // block j, Q4_1's panel layout
    for (int n = 0; n < 16; ++n)
        for (int i = 0; i < 16; ++i)  // byte i of row n: values i (low) and i + 16 (high); dword g at 64 g + 4 n
            out[64 * (i / 4) + 4 * n + i % 4] =
                uint8_t((v[n][32 * j + i] & 0x0F) | (v[n][32 * j + 16 + i] & 0x0F) << 4);
}

inline __m512 u8x16(__m128i v) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
}

struct Q4_K {
    static constexpr size_t super_bytes = 144;  // sizeof(block_q4_K): f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes
    static constexpr int offset = 0;
    static constexpr bool minima = true, high_bits = false, halves = false, super = true;
    static constexpr size_t d_at = 0, dmin_at = 32, scales_at = 64, values_at = 256;
    static void pack(const uint8_t * rows, size_t row_bytes, int64_t n_super, uint8_t * panel) {
        for (int64_t sb = 0; sb < n_super; ++sb) {
            uint8_t v[16][256], *out = panel + size_t(sb) * 16 * super_bytes;
            for (int n = 0; n < 16; ++n) {
                const uint8_t * b = rows + size_t(n) * row_bytes + size_t(sb) * super_bytes;
                for (int j = 0; j < 8; ++j)  // sub-block j: byte 32 (j / 2) + l's low (j even) or high nibble
                    for (int l = 0; l < 32; ++l) v[n][32 * j + l] = uint8_t(b[16 + 32 * (j / 2) + l] >> (4 * (j % 2)));
                std::memcpy(out + d_at + 2 * n, b, 2);
                std::memcpy(out + dmin_at + 2 * n, b + 2, 2);
                for (int k = 0; k < 12; ++k) out[scales_at + 16 * k + n] = b[4 + k];
            }
            for (int j = 0; j < 8; ++j) store_nibbles(v, j, out + values_at + 256 * j);
        }
    }
    // Block ib's values (u8 nibbles) and the 16 rows' scales d sc_j and minima -dmin m_j
    // (ggml's get_scale_min_k4, 16 rows at a time).
    static void block(const uint8_t * panel, int64_t ib, __m512i (&q)[8], __m512 & dw, __m512 & mw) {
        const uint8_t * sb = panel + size_t(ib / 8) * 16 * super_bytes;
        const int j = int(ib % 8);
        panel_nibbles(sb + values_at + 256 * j, q);
        const auto row = [&](int k) {
            return _mm_loadu_si128(reinterpret_cast<const __m128i *>(sb + scales_at + 16 * k));
        };
        const __m128i low6 = _mm_set1_epi8(63), low4 = _mm_set1_epi8(0x0F), bits45 = _mm_set1_epi8(0x30);
        __m128i sc, mn;
        if (j < 4) {
            sc = _mm_and_si128(row(j), low6);
            mn = _mm_and_si128(row(j + 4), low6);
        } else {  // (x >> 6) << 4 of each byte: (x >> 2) & 0x30
            sc = _mm_or_si128(_mm_and_si128(row(j + 4), low4), _mm_and_si128(_mm_srli_epi16(row(j - 4), 2), bits45));
            mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(row(j + 4), 4), low4),
                              _mm_and_si128(_mm_srli_epi16(row(j), 2), bits45));
        }
        dw = _mm512_mul_ps(f16x16(sb + d_at), u8x16(sc));
        mw = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(f16x16(sb + dmin_at), u8x16(mn)));
    }
};

struct Q6_K {
    static constexpr size_t super_bytes =
        210;  // sizeof(block_q6_K): 128 low-bit bytes, 64 high-bit bytes, 16 int8 scales, f16 d
    static constexpr int offset = 32;
    static constexpr bool minima = false, high_bits = false, halves = true, super = true;
    static constexpr size_t d_at = 0, scales_at = 32, values_at = 288, block_bytes = 384, h_at = 256;
    static void pack(const uint8_t * rows, size_t row_bytes, int64_t n_super, uint8_t * panel) {
        for (int64_t sb = 0; sb < n_super; ++sb) {
            uint8_t v[16][256], *out = panel + size_t(sb) * 16 * super_bytes;
            for (int n = 0; n < 16; ++n) {
                const uint8_t * b = rows + size_t(n) * row_bytes + size_t(sb) * super_bytes;
                const uint8_t *ql = b, *qh = b + 128;
                for (int half = 0; half < 2; ++half)  // dequantize_row_q6_K's order: 128 values per half
                    for (int l = 0; l < 32; ++l)
                        for (int k = 0; k < 4; ++k) {
                            const uint8_t low = ql[64 * half + l + 32 * (k % 2)] >> (4 * (k / 2));
                            const uint8_t high = qh[32 * half + l] >> (2 * k);
                            v[n][128 * half + 32 * k + l] = uint8_t((low & 0x0F) | (high & 3) << 4);
                        }
                for (int k = 0; k < 16; ++k) out[scales_at + 16 * k + n] = b[192 + k];
                std::memcpy(out + d_at + 2 * n, b + 208, 2);
            }
            for (int j = 0; j < 8; ++j) {
                store_nibbles(v, j, out + values_at + block_bytes * j);
                for (int k = 0; k < 2; ++k)
                    for (int n = 0; n < 16; ++n)
                        for (int t = 0; t < 4; ++t) {
                            uint8_t byte = 0;
                            for (int f = 0; f < 4; ++f)
                                byte |= uint8_t((v[n][32 * j + 4 * (4 * k + f) + t] >> 4) << (2 * f));
                            out[values_at + block_bytes * j + h_at + 64 * k + 4 * n + t] = byte;
                        }
            }
        }
    }
    // Block ib's values (u8 q) and the 16 rows' scales of its halves: d sc_2j (dw), d sc_2j+1 (mw).
    static void block(const uint8_t * panel, int64_t ib, __m512i (&q)[8], __m512 & dw, __m512 & mw) {
        const uint8_t * sb = panel + size_t(ib / 8) * 16 * super_bytes;
        const int j = int(ib % 8);
        const uint8_t * b = sb + values_at + block_bytes * j;
        panel_nibbles(b, q);
        const __m512i bits45 = _mm512_set1_epi8(0x30);
        for (int k = 0; k < 2; ++k) {
            const __m512i h = _mm512_loadu_si512(b + h_at + 64 * k);
            // field f to bits 4-5 (16-bit shifts: what crosses into the next byte lands outside 4-5)
            const __m512i at[4] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 2), h, _mm512_srli_epi16(h, 2)};
            for (int f = 0; f < 4; ++f)  // q | (at & 0x30)
                q[4 * k + f] = _mm512_ternarylogic_epi32(q[4 * k + f], at[f], bits45, 0xF8);
        }
        const auto scale = [&](int k) {
            return _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sb + scales_at + 16 * k))));
        };
        const __m512 d = f16x16(sb + d_at);
        dw = _mm512_mul_ps(d, scale(2 * j));
        mw = _mm512_mul_ps(d, scale(2 * j + 1));
    }
};

// Block ib of a panel (16 rows): its values as W::values gives them, the rows' scales, and their
// minima (Q4_1, Q4_K) or second halves' scales (Q6_K); zero where the type has neither.
template <class W>
inline void panel_block_of(const uint8_t * panel, int64_t ib, __m512i (&q)[8], __m512 & dw, __m512 & mw) {
    if constexpr (W::super) {
        W::block(panel, ib, q, dw, mw);
    } else {
        const uint8_t * pb = panel_block<W>(panel, ib);
        W::panel_values(pb, q);
        dw = panel_d<W>(pb);
        mw = W::minima ? panel_m<W>(pb) : _mm512_setzero_ps();
    }
}

template <class W>
void pack_kquant_panels(uint8_t * data, size_t row_bytes, int64_t K, int64_t N) {
    std::vector<uint8_t> rows(16 * row_bytes);
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
        std::memcpy(rows.data(), data + n0 * row_bytes, rows.size());
        W::pack(rows.data(), row_bytes, K / 256, data + n0 * row_bytes);
    }
}

template <class W>
void pack_panels_of(uint8_t * data, size_t row_bytes, int64_t K, int64_t N) {
    const int64_t nb = K / k_qk;
    std::vector<uint8_t> rows(16 * row_bytes);
    for (int64_t n0 = 0; n0 < N; n0 += 16) {
        uint8_t * panel = data + n0 * row_bytes;
        std::memcpy(rows.data(), panel, rows.size());
        Scalars s;
        for (int64_t ib = 0; ib < nb; ++ib) {
            const uint8_t * b = rows.data() + ib * W::block;
            s.read<W>(b, row_bytes, 16);
            __m512i o[8];
            W::raw(b, row_bytes, s, o);
            uint8_t * pb = panel + size_t(ib) * 16 * W::block;
            for (int g = 0; g < W::n_raw; ++g) _mm512_storeu_si512(pb + 64 * g, o[g]);
            const __m512i a = _mm512_load_si512(s.a);
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(pb + W::d_at), _mm512_cvtepi32_epi16(a));
            if constexpr (W::minima)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(pb + W::m_at),
                                    _mm512_cvtepi32_epi16(_mm512_srli_epi32(a, 16)));
            if constexpr (W::high_bits) _mm512_storeu_si512(pb + W::h_at, _mm512_load_si512(s.h));
        }
    }
}

// For each block ib of 16 rows (w: row 0's first block), in order: f(ib, values, scalars), the
// values as W::values gives them; each block's scalars read a block ahead (see Scalars).
template <class W, class F>
inline void for_each_block(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb, F && f) {
    Scalars s[2];
    s[0].read<W>(w, w_row_bytes, R);
    __m512i v[8];
    for (int64_t ib = 0; ib < nb; ++ib) {
        const Scalars & cur = s[ib % 2];
        if (ib + 1 < nb) s[(ib + 1) % 2].read<W>(w + (ib + 1) * W::block, w_row_bytes, R);
        W::values(w + ib * W::block, w_row_bytes, R, cur, v);
        f(ib, v, cur);
    }
}

}  // namespace kvlab::kernels::block

#endif
