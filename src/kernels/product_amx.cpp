// kvlab's own arithmetic for the products of Q4_1, Q5_0 and Q8_0 weights (and, from panels, Q4_K
// and Q6_K: see below), built for Intel AMX:
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
// bits whatever the batch size, the chunk or the thread count. Two kernels: amx_kernel() (the
// tiles for batches) and vnni_kernel() (VNNI for every batch size: CPUs without AMX, AMD Zen 4/5).
// How each weight type's blocks become the kernels' bytes and scales: block_types.h.
//

// GCC 12 reads the self-initialized value of _mm512_undefined_*() inside the intrinsics as
// "maybe uninitialized" once they are inlined here: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "kernels/block_types.h"
#include "kernels/products.h"
#include "kernels/vnni.h"
#include "kvlab/error.h"

// The block order on AVX-512 VNNI (pack, and the products of fewer than k_min_batch rows) needs
// VNNI and BITALG (Intel from Ice Lake, AMD from Zen 4); the AMX tiles (batches) need AMX-INT8.
#if defined(KVLAB_VNNI) && defined(__AVX512BITALG__)
#define KVLAB_BLOCK_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KVLAB_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace kvlab::kernels {

namespace {

constexpr int64_t k_min_batch = 16;  // activation rows from which the AMX tiles run; below, AVX-512 VNNI
constexpr int k_panel = 16;          // weight rows per panel: one AMX tile's columns, one zmm's lanes
constexpr int k_rows = 16;           // activation rows per AMX tile

int64_t padded_rows(int64_t M) {
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

bool supports(ggml_type type) {
    return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q8_0;
}

// The K-quants (256-value super-blocks) run only from panels (pack_panels).
bool kquant(ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
}

bool panel_supports(ggml_type type) {
    return supports(type) || kquant(type);
}

size_t packed_bytes(int64_t K, int64_t M) {
    const int64_t Mp = padded_rows(M);
    return size_t(Mp * K + 4 * (K / k_qk) * Mp * int64_t(sizeof(float)));
}

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
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth) {
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

using namespace block;  // the weight types (block_types.h)

// 64-byte aligned storage (the block sums are read with aligned loads).
template <class T>
struct AlignedAlloc {
    using value_type = T;
    AlignedAlloc() = default;
    template <class U>
    AlignedAlloc(const AlignedAlloc<U> &) {}
    T * allocate(size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(64))); }
    void deallocate(T * q, size_t) { ::operator delete(q, std::align_val_t(64)); }
    bool operator==(const AlignedAlloc &) const { return true; }
};

// A panel of 16 weight rows unpacked for the AMX tiles: per block the 8 vectors end to end (one
// B tile), and the rows' scales and minima (Q6_K: second halves' scales), [nb][16] each.
struct Panel {
    std::vector<uint8_t> q;                        // [nb][8][64]
    std::vector<float, AlignedAlloc<float>> d, m;  // [nb][16]

    template <class W>
    void unpack(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb) {
        q.resize(size_t(nb) * 512);
        d.resize(size_t(nb) * k_panel);
        m.resize(size_t(nb) * k_panel);
        for_each_block<W>(w, w_row_bytes, R, nb, [&](int64_t ib, const __m512i(&v)[8], const Scalars & s) {
            for (int g = 0; g < 8; ++g) _mm512_storeu_si512(&q[size_t(ib) * 512 + g * 64], v[g]);
            _mm512_store_ps(&d[ib * k_panel], s.d());
            _mm512_store_ps(&m[ib * k_panel], s.m());
        });
    }

    // The same from a panel of packed weights (pack_panels_of).
    template <class W>
    void unpack_panel(const uint8_t * panel, int64_t nb) {
        q.resize(size_t(nb) * 512);
        d.resize(size_t(nb) * k_panel);
        m.resize(size_t(nb) * k_panel);
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

void store(float * dst, __m512 v, int R) {
    _mm512_mask_storeu_ps(dst, __mmask16((1u << R) - 1), v);
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

template <class W>
void panel_vnni(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, int64_t M, float * dst,
                int64_t dst_stride, int R) {
    int64_t m0 = 0;
    for (; m0 + k_vnni_rows <= M; m0 += k_vnni_rows) tile_vnni<W, k_vnni_rows>(p, nb, y, Mp, K, m0, dst, dst_stride, R);
    if (m0 < M) tail_vnni<W>(int(M - m0), p, nb, y, Mp, K, m0, dst, dst_stride, R);
}

#ifdef KVLAB_AMX

// AMX tile configuration, twice (tmm0-2 and tmm3-5, for two blocks in flight): the block sums
// (16 x 16 int32), 16 activation rows x 32 int8, the panel's block (8 rows x 64 u8).
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
    TileConfig() {
        for (int t : {0, 3}) {
            colsb[t] = 64, rows[t] = 16;
            colsb[t + 1] = 32, rows[t + 1] = 16;
            colsb[t + 2] = 64, rows[t + 2] = 8;
        }
    }
};

// The integer sums of block ib for 16 activation rows m0.. x the panel's 16 rows, into sums, in
// tiles 0-2 or 3-5 (the intrinsics take a tile's number as a literal).
inline const int8_t * rows_of(const Packed & y, int64_t K, int64_t m0, int64_t ib) {
    return y.qs + m0 * K + ib * k_qk;
}

inline void block_sums(const Panel & p, const Packed & y, int64_t K, int64_t m0, int64_t ib, int32_t * sums) {
    if (ib % 2 == 0) {
        _tile_loadd(1, rows_of(y, K, m0, ib), K);
        _tile_loadd(2, &p.q[size_t(ib) * 512], 64);
        _tile_zero(0);
        _tile_dpbsud(0, 1, 2);
        _tile_stored(0, sums, 64);
    } else {
        _tile_loadd(4, rows_of(y, K, m0, ib), K);
        _tile_loadd(5, &p.q[size_t(ib) * 512], 64);
        _tile_zero(3);
        _tile_dpbsud(3, 4, 5);
        _tile_stored(3, sums, 64);
    }
}

// A panel against every activation row, as a sequence of units: 16 activation rows x a run of at
// most k_unit_blocks blocks. A unit's tile products (block_sums) fill one of two sums buffers
// while the previous unit's steps read the other, each row's chain continuing from acc (the
// 16 rows' accumulators of the current row tile) and ending in dst at the row tile's last unit.
// The steps go 4 rows at a time (4 chains interleaved, in registers); the next unit's tile
// products are issued a quarter before each of the 4 row groups, so that the tile unit and the
// vector units work at the same time.
template <class W>
class PanelProduct {
public:
    static constexpr int64_t k_unit_blocks = 8;

    using Sums = std::vector<int32_t, AlignedAlloc<int32_t>>;  // [k_unit_blocks][16 rows][16]

    PanelProduct(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, Sums (&sums)[2])
        : p_(p), y_(y), nb_(nb), Mp_(Mp), K_(K), per_tile_((nb + k_unit_blocks - 1) / k_unit_blocks), sums_(sums) {
        for (Sums & b : sums_) b.resize(size_t(k_unit_blocks) * k_rows * 16);
    }

    void run(float * dst, int64_t dst_stride, int64_t M, int R) {
        std::atomic_signal_fence(std::memory_order_seq_cst);  // the tile loads read what the unpack wrote
        const int64_t n_units = Mp_ / k_rows * per_tile_;
        issue(0, 0, 1);
        for (int64_t u = 0; u < n_units; ++u) {
            const int64_t m0 = u / per_tile_ * k_rows;
            const auto [ib0, ib1] = blocks(u);
            const bool first = ib0 == 0, last = ib1 == nb_;
            const int32_t * sums = sums_[u % 2].data();
            for (int g = 0; g < 4; ++g) {
                if (u + 1 < n_units) issue(u + 1, g, 4);
                const int r = 4 * g;
                __m512 a0, a1, a2, a3;
                if (first) {
                    a0 = a1 = a2 = a3 = _mm512_setzero_ps();
                } else {
                    a0 = _mm512_load_ps(acc_ + (r + 0) * 16), a1 = _mm512_load_ps(acc_ + (r + 1) * 16);
                    a2 = _mm512_load_ps(acc_ + (r + 2) * 16), a3 = _mm512_load_ps(acc_ + (r + 3) * 16);
                }
                for (int64_t ib = ib0; ib < ib1; ++ib) {
                    const int32_t * c = sums + ((ib - ib0) * k_rows + r) * 16;
                    const __m512 dw = _mm512_load_ps(&p_.d[ib * k_panel]), mw = _mm512_load_ps(&p_.m[ib * k_panel]);
                    const float * dy = y_.d + ib * Mp_ + m0 + r;
                    const float * sy = y_.s + ib * Mp_ + m0 + r;
                    const int32_t * qy = y_.q + ib * Mp_ + m0 + r;
                    a0 = step<W>(a0, _mm512_load_si512(c), dw, mw, dy[0], sy[0], qy[0]);
                    a1 = step<W>(a1, _mm512_load_si512(c + 16), dw, mw, dy[1], sy[1], qy[1]);
                    a2 = step<W>(a2, _mm512_load_si512(c + 32), dw, mw, dy[2], sy[2], qy[2]);
                    a3 = step<W>(a3, _mm512_load_si512(c + 48), dw, mw, dy[3], sy[3], qy[3]);
                }
                const __m512 a[4] = {a0, a1, a2, a3};
                for (int i = 0; i < 4; ++i) {
                    if (!last)
                        _mm512_store_ps(acc_ + (r + i) * 16, a[i]);
                    else if (m0 + r + i < M)
                        store(dst + (m0 + r + i) * dst_stride, a[i], R);
                }
            }
        }
    }

private:
    std::pair<int64_t, int64_t> blocks(int64_t u) const {  // the unit's blocks, runs of equal length
        const int64_t k = u % per_tile_;
        return {nb_ * k / per_tile_, nb_ * (k + 1) / per_tile_};
    }

    // Part `part` of `parts` of unit u's tile products.
    void issue(int64_t u, int part, int parts) {
        const int64_t m0 = u / per_tile_ * k_rows;
        const auto [ib0, ib1] = blocks(u);
        const int64_t n = ib1 - ib0;
        int32_t * sums = sums_[u % 2].data();
        for (int64_t i = n * part / parts; i < n * (part + 1) / parts; ++i)
            block_sums(p_, y_, K_, m0, ib0 + i, sums + i * k_rows * 16);
    }

    const Panel & p_;
    const Packed & y_;
    const int64_t nb_, Mp_, K_, per_tile_;
    Sums (&sums_)[2];
    alignas(64) float acc_[k_rows * 16];
};

// Linux gives a process the AMX tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM).
bool request_tiles() {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8") ||
        !__builtin_cpu_supports("avx512vnni"))
        return false;
    constexpr int k_req_xcomp_perm = 0x1023, k_xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, k_req_xcomp_perm, k_xfeature_xtiledata) == 0;
}

#endif  // KVLAB_AMX

// tiles: batches of k_min_batch rows and more on the AMX tiles (amx_kernel), else by VNNI
// (vnni_kernel); panels: w packed into panels (pack_panels_of; N a multiple of 16).
template <class W>
void product_of(bool tiles, bool panels, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N,
                const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith, int nth) {
    const int64_t nb = K / k_qk, Mp = padded_rows(M);
    const Packed y(packed, K, Mp);
    const int64_t n_panels = (N + k_panel - 1) / k_panel;
    const int64_t p0 = n_panels * ith / nth, p1 = n_panels * (ith + 1) / nth;
    if (p0 == p1) return;
    if constexpr (W::super) {
        if (!panels) throw Error("internal", "[products] block order: K-quant weights run only from panels");
    }
    if (M < k_min_batch) {
        for (int64_t ip = p0; ip < p1; ++ip) {
            const int64_t n0 = ip * k_panel;
            const int R = int(std::min<int64_t>(k_panel, N - n0));
            if constexpr (!W::super) {
                if (!panels) {
                    rows_vnni<W>(w + n0 * w_row_bytes, w_row_bytes, R, nb, y, M, K, dst + n0, dst_stride);
                    continue;
                }
            }
            rows_panel<W>(w + n0 * w_row_bytes, k_panel * w_row_bytes, nb, y, M, K, dst + n0, dst_stride);
        }
        return;
    }
    thread_local Panel panel;
    const auto unpack = [&](int64_t n0, int R) {
        if constexpr (!W::super) {
            if (!panels) return panel.unpack<W>(w + n0 * w_row_bytes, w_row_bytes, R, nb);
        }
        panel.unpack_panel<W>(w + n0 * w_row_bytes, nb);
    };
    if (!tiles || W::halves) {  // Q6_K's two sums per block: not from one tile product
        for (int64_t ip = p0; ip < p1; ++ip) {
            const int64_t n0 = ip * k_panel;
            const int R = int(std::min<int64_t>(k_panel, N - n0));
            unpack(n0, R);
            panel_vnni<W>(panel, nb, y, Mp, K, M, dst + n0, dst_stride, R);
        }
        return;
    }
#ifdef KVLAB_AMX
    if constexpr (!W::halves) {  // (Q6_K returned above)
        static const TileConfig cfg;
        _tile_loadconfig(&cfg);
        thread_local typename PanelProduct<W>::Sums sums[2];
        for (int64_t ip = p0; ip < p1; ++ip) {
            const int64_t n0 = ip * k_panel;
            const int R = int(std::min<int64_t>(k_panel, N - n0));
            unpack(n0, R);
            PanelProduct<W>(panel, nb, y, Mp, K, sums).run(dst + n0, dst_stride, M, R);
        }
        _tile_release();
    }
#else
    throw Error("internal", "[products] amx: a batch of " + std::to_string(M) + " rows needs the AMX tiles");
#endif
}

}  // namespace

bool available() {
#ifdef KVLAB_AMX
    static const bool ok = request_tiles();
    return ok;
#else
    return false;
#endif
}

bool rows_available() {
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bitalg");
}

void product_with(bool tiles, bool panels, ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N,
                  const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith, int nth) {
    switch (type) {
        case GGML_TYPE_Q4_1:
            return product_of<Q4_1>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
        case GGML_TYPE_Q5_0:
            return product_of<Q5_0>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
        case GGML_TYPE_Q8_0:
            return product_of<Q8_0>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
        case GGML_TYPE_Q4_K:
            return product_of<Q4_K>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
        case GGML_TYPE_Q6_K:
            return product_of<Q6_K>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
        default:
            throw Error("internal", std::string("[products] block order: no kernel for ") + ggml_type_name(type));
    }
}

template <bool Tiles, bool Panels>
void product(ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed,
             int64_t M, float * dst, int64_t dst_stride, int ith, int nth) {
    product_with(Tiles, Panels, type, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth);
}

// Row n of a Q8_0 matrix packed into panels, dequantized as ggml's dequantize_row_q8_0 does
// (value x scale, one float product each: the same floats).
void q8_0_panel_row(const uint8_t * data, size_t row_bytes, int64_t K, int64_t n, float * out) {
    const uint8_t * panel = data + (n / k_panel) * k_panel * row_bytes;
    const int r = int(n % k_panel);
    for (int64_t ib = 0; ib < K / k_qk; ++ib) {
        const uint8_t * pb = panel_block<Q8_0>(panel, ib);
        uint16_t h;
        std::memcpy(&h, pb + Q8_0::d_at + 2 * r, 2);
        const float d = _cvtsh_ss(h);
        for (int j = 0; j < k_qk; ++j) out[ib * k_qk + j] = float(int8_t(pb[64 * (j / 4) + 4 * r + j % 4] ^ 0x80)) * d;
    }
}

bool panels_fit(const ggml_tensor * w) {
    return panel_supports(w->type) && ggml_n_dims(w) == 2 && w->ne[0] % ggml_blck_size(w->type) == 0 &&
           w->ne[1] % k_panel == 0 && w->nb[1] == ggml_row_size(w->type, w->ne[0]);
}

void pack_panels_in_place(ggml_tensor * w) {
    uint8_t * data = static_cast<uint8_t *>(w->data);
    switch (w->type) {
        case GGML_TYPE_Q4_1:
            return pack_panels_of<Q4_1>(data, w->nb[1], w->ne[0], w->ne[1]);
        case GGML_TYPE_Q5_0:
            return pack_panels_of<Q5_0>(data, w->nb[1], w->ne[0], w->ne[1]);
        case GGML_TYPE_Q8_0:
            return pack_panels_of<Q8_0>(data, w->nb[1], w->ne[0], w->ne[1]);
        case GGML_TYPE_Q4_K:
            return pack_kquant_panels<Q4_K>(data, w->nb[1], w->ne[0], w->ne[1]);
        case GGML_TYPE_Q6_K:
            return pack_kquant_panels<Q6_K>(data, w->nb[1], w->ne[0], w->ne[1]);
        default:
            throw Error("internal", std::string("[products] panels: no layout for ") + ggml_type_name(w->type));
    }
}

#else

bool available() {
    return false;
}

bool rows_available() {
    return false;
}

void pack(const float *, int64_t, int64_t, int64_t, uint8_t *, int, int) {}
template <bool Tiles, bool Panels>
void product(ggml_type, const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int,
             int) {}
void q8_0_panel_row(const uint8_t *, size_t, int64_t, int64_t, float *) {}
bool panels_fit(const ggml_tensor *) {
    return false;
}
void pack_panels_in_place(ggml_tensor *) {}

#endif

}  // namespace

bool amx_rows_available() {
    return rows_available();
}

const ProductKernel & amx_kernel(bool panels) {
    static const ProductKernel k = {"amx", k_min_batch, available, supports, packed_bytes, pack, product<true, false>};
    static const ProductKernel kp = {"amx",        k_min_batch, available,          panel_supports,
                                     packed_bytes, pack,        product<true, true>};
    return panels ? kp : k;
}

const ProductKernel & vnni_kernel(bool panels) {
    static const ProductKernel k = {"vnni",       k_min_batch, rows_available,       supports,
                                    packed_bytes, pack,        product<false, false>};
    static const ProductKernel kp = {"vnni",       k_min_batch, rows_available,      panel_supports,
                                     packed_bytes, pack,        product<false, true>};
    return panels ? kp : k;
}

bool panels_available(const ggml_tensor * w) {
    return rows_available() && panels_fit(w);
}

void panel_rows(const ggml_tensor * w, const int32_t * ids, int64_t n, float * out, int64_t out_stride) {
    if (w->type != GGML_TYPE_Q8_0) throw Error("internal", std::string("[products] panels: no rows of ") + w->name);
    for (int64_t i = 0; i < n; ++i)
        q8_0_panel_row(static_cast<const uint8_t *>(w->data), w->nb[1], w->ne[0], ids[i], out + i * out_stride);
}

void pack_panels(ggml_tensor * w) {
    if (!panels_available(w)) throw Error("internal", std::string("[products] panels: cannot pack ") + w->name);
    pack_panels_in_place(w);
}

}  // namespace kvlab::kernels
