// Built with -ffast-math (CMakeLists.txt) so that the exp loops vectorise; nothing here
// relies on infinities or NaNs: the running max starts at a finite sentinel.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kvlab/error.h"

namespace kvlab::kernels::attn {

namespace {

constexpr float k_no_max = -3.0e38f;   // running max before any row
constexpr float k_exp_floor = -87.0f;  // expf(-87) = 1.6e-38, the smallest normal float's order
constexpr int k_lanes = 16;            // floats per vector
constexpr int k_block = 64;            // key rows scored per block (k_kv vectors of keys)
constexpr int k_kv = k_block / k_lanes;
constexpr int k_tile = 16;               // query rows per work unit
constexpr int k_mq = 4;                  // query vectors per micro-tile
constexpr int k_decode_vecs = 2 * k_mq;  // query vectors of a decode's own loop (compute_decode)

// GCC/Clang vector extension: AVX-512 with -march=native on such CPUs, pairs of AVX2
// registers elsewhere. Operations between a vector and a scalar broadcast the scalar.
typedef float v16 __attribute__((vector_size(k_lanes * sizeof(float))));

void to_f32(const ggml_fp16_t * x, float * y, int n) {
    int i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x + i))));
#endif
    for (; i < n; ++i) y[i] = ggml_fp16_to_fp32(x[i]);
}

float sum_block(const v16 * p) {  // fixed summation tree over the k_block lanes
    v16 t = (p[0] + p[1]) + (p[2] + p[3]);
#if defined(__AVX512F__)
    // the tree below in registers: lanes i + 8, i + 4, i + 2, i + 1 added to lane i, as there
    const __m512 v = (__m512)t;
    const __m256 h8 =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    h4 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    return _mm_cvtss_f32(_mm_add_ss(h4, _mm_movehdup_ps(h4)));
#else
    float s[k_lanes];
    std::memcpy(s, &t, sizeof(s));
    for (int w = k_lanes / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) s[i] += s[i + w];
    return s[0];
#endif
}

// The micro-kernels of one block: MQ query vectors against the k_block keys of a block,
// compile-time sizes so that the score tile and the accumulators stay in registers. Each
// output element is the same fixed sequence of operations as in the plain loops they
// replace (FMA chains over d in order for a score, over the block's rows in order for an
// accumulator), so the bits never depend on MQ or on which vectors share a micro-tile.

// s[x][y] = q_x . K^T for the block (kt: [d][k_kv] vectors, keys transposed).
template <int MQ>
inline void score_tile(const v16 * kt, const float * const * q, int d, v16 (&s)[k_mq][k_kv]) {
    static_assert(k_kv == 4, "the tile holds 4 vectors of keys");
    v16 t[MQ][k_kv] = {};
    for (int e = 0; e < d; ++e) {
        const v16 * kr = kt + size_t(e) * k_kv;
        const v16 k0 = kr[0], k1 = kr[1], k2 = kr[2], k3 = kr[3];
        for (int x = 0; x < MQ; ++x) {
            const float qe = q[x][e];
            t[x][0] += qe * k0;
            t[x][1] += qe * k1;
            t[x][2] += qe * k2;
            t[x][3] += qe * k3;
        }
    }
    for (int x = 0; x < MQ; ++x)
        for (int y = 0; y < k_kv; ++y) s[x][y] = t[x][y];
}

// Scales the scores of one vector, masks the lanes before na or at or beyond nb and
// returns their max.
inline float scale_mask_max(v16 (&sx)[k_kv], int na, int nb, float scale) {
    typedef int32_t i16 __attribute__((vector_size(k_lanes * sizeof(int32_t))));
    i16 lane;
    for (int i = 0; i < k_lanes; ++i) lane[i] = i;
    v16 mx = sx[0] * 0.0f + k_no_max;
    for (int y = 0; y < k_kv; ++y) {
        const i16 j = lane + y * k_lanes;
        sx[y] = j < nb && j >= na ? sx[y] * scale : sx[y] * 0.0f + k_no_max;
        mx = mx > sx[y] ? mx : sx[y];
    }
    float m = k_no_max;
    for (int i = 0; i < k_lanes; ++i) m = std::max(m, mx[i]);
    return m;
}

// acc_x += sum over the block's rows j < nb_max of w_x[j] * V[j], rows in order.
// DV: vectors per V row (head_dim / 16, rounded up).
template <int MQ, int DV>
inline void accumulate(v16 * const * acc, const float * const * w, const v16 * vb, int nb_max) {
    v16 a[MQ][DV];
    for (int x = 0; x < MQ; ++x)
        for (int y = 0; y < DV; ++y) a[x][y] = acc[x][y];
    for (int j = 0; j < nb_max; ++j) {
        const v16 * vr = vb + size_t(j) * DV;
        for (int x = 0; x < MQ; ++x) {
            const float wx = w[x][j];
            for (int y = 0; y < DV; ++y) a[x][y] += wx * vr[y];
        }
    }
    for (int x = 0; x < MQ; ++x)
        for (int y = 0; y < DV; ++y) acc[x][y] = a[x][y];
}

// accumulate() for mq vectors and a run-time dv: register tiles up to 16 accumulators.
template <int DV>
void accumulate_n(int mq, v16 * const * acc, const float * const * w, const v16 * vb, int nb_max) {
    constexpr int G = DV <= 4 ? 4 : DV <= 8 ? 2 : 1;
    int x = 0;
    for (; x + G <= mq; x += G) accumulate<G, DV>(acc + x, w + x, vb, nb_max);
    for (; x < mq; ++x) accumulate<1, DV>(acc + x, w + x, vb, nb_max);
}

[[gnu::always_inline]] inline void accumulate_any(int mq, int dv, v16 * const * acc, const float * const * w,
                                                  const v16 * vb, int nb_max) {
    switch (dv) {
        case 1:
            return accumulate_n<1>(mq, acc, w, vb, nb_max);
        case 2:
            return accumulate_n<2>(mq, acc, w, vb, nb_max);
        case 3:
            return accumulate_n<3>(mq, acc, w, vb, nb_max);
        case 4:
            return accumulate_n<4>(mq, acc, w, vb, nb_max);
        case 5:
            return accumulate_n<5>(mq, acc, w, vb, nb_max);
        case 6:
            return accumulate_n<6>(mq, acc, w, vb, nb_max);
        case 7:
            return accumulate_n<7>(mq, acc, w, vb, nb_max);
        case 8:
            return accumulate_n<8>(mq, acc, w, vb, nb_max);
        case 16:  // head_dim 256 (gemma3): one vector's 16 accumulators in registers
            return accumulate_n<16>(mq, acc, w, vb, nb_max);
        default:
            break;
    }
    for (int j = 0; j < nb_max; ++j) {  // head_dim > 128: the plain loop, same order
        const v16 * vr = vb + size_t(j) * dv;
        for (int x = 0; x < mq; ++x)
            for (int y = 0; y < dv; ++y) acc[x][y] += w[x][j] * vr[y];
    }
}

#if defined(__AVX512F__)
// accumulate() over F16 V rows read where they are stored ([rows][d], d = 16 DV), each vector
// converted as it is read (the same floats as a converted block): a decode, which would
// otherwise convert and store each row only to load it back once. Every vector of a row is read
// once for the MQ query vectors.
template <int MQ, int DV>
inline void accumulate_half(v16 * const * acc, const float * const * w, const ggml_fp16_t * rows, int nb_max) {
    v16 a[MQ][DV];
    for (int x = 0; x < MQ; ++x)
        for (int y = 0; y < DV; ++y) a[x][y] = acc[x][y];
    for (int j = 0; j < nb_max; ++j) {
        v16 vr[DV];
        for (int y = 0; y < DV; ++y)
            vr[y] = (v16)_mm512_cvtph_ps(_mm256_loadu_si256(
                reinterpret_cast<const __m256i *>(rows + size_t(j) * DV * k_lanes + size_t(y) * k_lanes)));
        for (int x = 0; x < MQ; ++x) {
            const float wx = w[x][j];
            for (int y = 0; y < DV; ++y) a[x][y] += wx * vr[y];
        }
    }
    for (int x = 0; x < MQ; ++x)
        for (int y = 0; y < DV; ++y) acc[x][y] = a[x][y];
}

template <int DV>
void accumulate_half_n(int mq, v16 * const * acc, const float * const * w, const ggml_fp16_t * rows, int nb_max) {
    static_assert(k_mq == 4 && DV <= 4, "one register tile: up to 4 query vectors of up to 4 vectors");
    switch (mq) {
        case 4:
            return accumulate_half<4, DV>(acc, w, rows, nb_max);
        case 3:
            return accumulate_half<3, DV>(acc, w, rows, nb_max);
        case 2:
            return accumulate_half<2, DV>(acc, w, rows, nb_max);
        default:
            return accumulate_half<1, DV>(acc, w, rows, nb_max);
    }
}

// rows: the block's first F16 V row; d = 16 dv, dv <= 4 (half_rows()).
void accumulate_half_any(int mq, int dv, v16 * const * acc, const float * const * w, const ggml_fp16_t * rows,
                         int nb_max) {
    switch (dv) {
        case 1:
            return accumulate_half_n<1>(mq, acc, w, rows, nb_max);
        case 2:
            return accumulate_half_n<2>(mq, acc, w, rows, nb_max);
        case 3:
            return accumulate_half_n<3>(mq, acc, w, rows, nb_max);
        default:
            return accumulate_half_n<4>(mq, acc, w, rows, nb_max);
    }
}
#endif

[[gnu::always_inline]] inline void score_any(int mq, const v16 * kt, const float * const * q, int d,
                                             v16 (&s)[k_mq][k_kv]) {
    switch (mq) {
        case 1:
            return score_tile<1>(kt, q, d, s);
        case 2:
            return score_tile<2>(kt, q, d, s);
        case 3:
            return score_tile<3>(kt, q, d, s);
        default:
            return score_tile<4>(kt, q, d, s);
    }
}

// Per-thread scratch: one block of K transposed to [head_dim][k_block] and of V as
// [k_block][head_dim rounded up to vectors], float32, zero beyond the rows present; the
// running state of the unit's query vectors.
// A thread's working memory, in its slice of the node's scratch (compute_scratch): a block of K
// transposed and of V converted, the accumulators of `vecs` query vectors with their running maxima
// and sums, one converted row.
struct Scratch {
    v16 *kt, *vb, *acc;
    float *m, *l, *row;

    static SliceSize size(int d, int vecs) {
        const size_t dv = size_t((d + k_lanes - 1) / k_lanes);
        return SliceSize()
            .add<v16>(size_t(d) * k_kv)
            .add<v16>(size_t(k_block) * dv)
            .add<v16>(size_t(vecs) * dv)
            .add<float>(size_t(vecs))
            .add<float>(size_t(vecs))
            .add<float>(dv * k_lanes);
    }
    // K and V's blocks zeroed (a block's rows past the segment's end read as zero)
    Scratch(Slice & s, int d, int vecs) {
        const size_t dv = size_t((d + k_lanes - 1) / k_lanes);
        kt = s.take<v16>(size_t(d) * k_kv);
        vb = s.take<v16>(size_t(k_block) * dv);
        acc = s.take<v16>(size_t(vecs) * dv);
        m = s.take<float>(size_t(vecs));
        l = s.take<float>(size_t(vecs));
        row = s.take<float>(dv * k_lanes);
        std::fill(kt, kt + size_t(d) * k_kv, v16{});
        std::fill(vb, vb + size_t(k_block) * dv, v16{});
    }
};

bool decodes(const Problem & p, bool pre) {  // compute_decode's case (pre: blocks converted ahead)
    return !pre && p.n_q == 1 && p.n_head / p.n_head_kv <= k_decode_vecs;
}

}  // namespace

namespace {

int64_t block_floats(int d) {  // one block converted: K^T [d][k_block], V [k_block][dv * k_lanes]
    const int dv = (d + k_lanes - 1) / k_lanes;
    return int64_t(d) * k_block + int64_t(k_block) * dv * k_lanes;
}

// Blocks of a head's rows converted ahead: those of its demoted run's chunks, then its segment's.
int64_t n_blocks(const Problem & p) {
    int64_t rows = 0;
    for (const Segment & sg : p.seg) rows = std::max(rows, sg.n);
    return (int64_t(p.low_chunks()) * p.chunk_rows + rows + k_block - 1) / k_block;
}

#if defined(__AVX512F__)
// r[i] = row i of a 16 x 16 float tile -> r[c] = column c (unpack, then three rounds of shuffles).
[[gnu::always_inline]] inline void transpose16_inline(__m512 (&r)[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane k: (r2i[4k], r2i+1[4k], r2i[4k+1], r2i+1[4k+1]), ...
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; ++g) {  // u[4g + m], lane k: column 4k + m of rows 4g..4g+3
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 2; ++h)  // rows 8h..8h+7: columns m, m + 8 (0x88) and m + 4, m + 12 (0xdd)
        for (int m = 0; m < 4; ++m) {
            t[8 * h + m] = _mm512_shuffle_f32x4(u[8 * h + m], u[8 * h + 4 + m], 0x88);
            t[8 * h + 4 + m] = _mm512_shuffle_f32x4(u[8 * h + m], u[8 * h + 4 + m], 0xdd);
        }
    for (int c = 0; c < 8; ++c) {  // all 16 rows of column c and of column c + 8
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
    }
}

// Out of line where the tile goes back to memory (convert_block): inlined there, gemma3-270m's
// decode (head_dim 256, converted blocks) ran slower; score_in_place inlines it (the tile stays
// in registers for its FMAs).
[[gnu::noinline]] void transpose16(__m512 (&r)[16]) {
    transpose16_inline(r);
}
#endif

// Row j of a segment's K or V (type t, head_dim d) as d floats: the values ggml's own
// dequantizer gives (an F16 value, or d * q: an int times an F16 scale, exact in float).
void row_to_f32(ggml_type t, const void * base, int64_t j, int d, float * y) {
    if (t == GGML_TYPE_F16) return to_f32(static_cast<const ggml_fp16_t *>(base) + j * d, y, d);
    const auto * row = static_cast<const uint8_t *>(base) + size_t(j) * ggml_row_size(t, d);
    ggml_get_type_traits(t)->to_float(row, y, d);
}

#if defined(__AVX512F__)
// Values [e0, e0 + 16) of a row (type t; e0 a multiple of 16) as floats, bit-equal to
// row_to_f32's: the same exact products. Inline throughout (a decode converts every row).
inline __m512 load16(ggml_type t, const uint8_t * row, int e0) {
    if (t == GGML_TYPE_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(row + size_t(e0) * 2)));
    const int blk = e0 / 32, half = (e0 % 32) / 16;
    uint16_t dh;
    if (t == GGML_TYPE_Q8_0) {  // 2-byte F16 scale, 32 int8
        const uint8_t * b = row + size_t(blk) * 34;
        std::memcpy(&dh, b, sizeof(dh));
        const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2 + 16 * half)));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(_cvtsh_ss(dh)));
    }
    // Q4_0: 2-byte F16 scale, 16 bytes: value i < 16 in the low nibble of byte i, value 16 + i in its high one
    const uint8_t * b = row + size_t(blk) * 18;
    std::memcpy(&dh, b, sizeof(dh));
    __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 2));
    if (half) bytes = _mm_srli_epi16(bytes, 4);
    bytes = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(_cvtsh_ss(dh)));
}
#endif

// The K and V rows a decode reads next, into L1 ahead of the 16-row groups: 4 KiB ahead of each
// stream (two groups of F16 rows at head_dim 64). Farther, the two streams' lines in flight and
// the block's float32 scratch (32 KiB) overflow L1: smollm2-135m decode after 4,005 tokens, 1
// thread, AMD EPYC Zen 5: 16 KiB 110-115 tok/s, 8 KiB 107-117, 4 KiB 120-127, 2 KiB 113-117,
// 1 KiB 94-97; an L2 prefetch 16 KiB ahead besides 4 KiB: 105-108.
constexpr size_t k_rows_ahead = 4096;
inline void prefetch_rows(const uint8_t * p) {
    __builtin_prefetch(p + k_rows_ahead, 0, 3);
}

// Rows [b, b + k_block) of a segment, the rows from `end` on as zeros: K transposed into kt
// [d][k_block], V into vb [k_block][dv * k_lanes] (zero beyond d; vb nullptr: V left where it is,
// its rows only prefetched). Data movement and exact conversion only: the floats are the stored
// values, however they are moved.
void convert_block(const Segment & sg, int d, int64_t b, int64_t end, float * kt, float * vb, float * row) {
    const int dv = (d + k_lanes - 1) / k_lanes;
    const int nr = int(std::clamp<int64_t>(end - b, 0, k_block));
    int j0 = 0;
#if defined(__AVX512F__)
    if (d % 16 == 0) {  // whole 16 x 16 tiles of K transposed in registers, V rows converted 16 wide
        const size_t kr = ggml_row_size(sg.k_type, d), vr = ggml_row_size(sg.v_type, d);
        const auto * kb = static_cast<const uint8_t *>(sg.k) + size_t(b) * kr;
        const auto * vbase = static_cast<const uint8_t *>(sg.v) + size_t(b) * vr;
        for (; j0 + 16 <= nr; j0 += 16) {
            for (size_t off = 0; off < 16 * kr; off += 64) prefetch_rows(kb + size_t(j0) * kr + off);
            for (size_t off = 0; off < 16 * vr; off += 64) prefetch_rows(vbase + size_t(j0) * vr + off);
            for (int e0 = 0; e0 < d; e0 += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; ++i) r[i] = load16(sg.k_type, kb + size_t(j0 + i) * kr, e0);
                transpose16(r);
                for (int e = 0; e < 16; ++e) _mm512_storeu_ps(kt + size_t(e0 + e) * k_block + j0, r[e]);
            }
            if (vb)
                for (int j = j0; j < j0 + 16; ++j)
                    for (int e0 = 0; e0 < d; e0 += 16)
                        _mm512_storeu_ps(vb + size_t(j) * dv * k_lanes + e0,
                                         load16(sg.v_type, vbase + size_t(j) * vr, e0));
        }
    }
#endif
    for (int j = j0; j < k_block; ++j) {
        if (j < nr) {
            row_to_f32(sg.k_type, sg.k, b + j, d, row);
            for (int e = 0; e < d; ++e) kt[e * k_block + j] = row[e];
            if (!vb) continue;
            row_to_f32(sg.v_type, sg.v, b + j, d, vb + size_t(j) * dv * k_lanes);
            std::fill(vb + size_t(j) * dv * k_lanes + d, vb + size_t(j + 1) * dv * k_lanes, 0.0f);
        } else {
            for (int e = 0; e < d; ++e) kt[e * k_block + j] = 0.0f;
            if (vb) std::fill(vb + size_t(j) * dv * k_lanes, vb + size_t(j + 1) * dv * k_lanes, 0.0f);
        }
    }
}

// Whether compute() reads a segment's V rows in place (accumulate_half: F16, head_dim 16, 32, 48 or
// 64) instead of converting them.
bool half_rows(const Segment & sg, int d) {
#if defined(__AVX512F__)
    return sg.v_type == GGML_TYPE_F16 && d % k_lanes == 0 && d <= 4 * k_lanes;
#else
    (void)sg, (void)d;
    return false;
#endif
}

#if defined(__AVX512F__)
// score_tile's scores of MQ query vectors against a whole block of F16 K rows read where they are
// stored (kb: the block's first row, kr bytes apart; d a multiple of 16): each 16 x 16 tile is
// transposed in registers and used there, with no float32 copy of the block. Every score is the
// same FMA chain over d in order as score_tile's. Prefetches the K and V rows ahead as
// convert_block does (vrows: the block's first V row, vr bytes apart).
template <int MQ>
void score_in_place(const uint8_t * kb, size_t kr, const uint8_t * vrows, size_t vr, const float * const * q, int d,
                    v16 (*s)[k_kv]) {
    for (int y = 0; y < k_kv; ++y) {
        const uint8_t * rows = kb + size_t(y) * k_lanes * kr;
        for (size_t off = 0; off < k_lanes * kr; off += 64) prefetch_rows(rows + off);
        for (size_t off = 0; off < k_lanes * vr; off += 64) prefetch_rows(vrows + size_t(y) * k_lanes * vr + off);
        // explicit FMAs: written as t += q * k in this unrolled loop, -ffast-math lets the compiler
        // split the chain into partial sums (other bits than score_tile's loop)
        __m512 t[MQ];
        for (int x = 0; x < MQ; ++x) t[x] = _mm512_setzero_ps();
        for (int e0 = 0; e0 < d; e0 += k_lanes) {
            __m512 r[16];
            for (int i = 0; i < 16; ++i)
                r[i] = _mm512_cvtph_ps(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i *>(rows + size_t(i) * kr) + e0 / k_lanes));
            transpose16_inline(r);
            for (int e = 0; e < 16; ++e)
                for (int x = 0; x < MQ; ++x) t[x] = _mm512_fmadd_ps(_mm512_set1_ps(q[x][e0 + e]), r[e], t[x]);
        }
        for (int x = 0; x < MQ; ++x) s[x][y] = (v16)t[x];
    }
}

// mq <= k_decode_vecs vectors: one transposed tile serves them all.
void score_in_place_any(int mq, const uint8_t * kb, size_t kr, const uint8_t * vrows, size_t vr,
                        const float * const * q, int d, v16 (*s)[k_kv]) {
    switch (mq) {
        case 1:
            return score_in_place<1>(kb, kr, vrows, vr, q, d, s);
        case 2:
            return score_in_place<2>(kb, kr, vrows, vr, q, d, s);
        case 3:
            return score_in_place<3>(kb, kr, vrows, vr, q, d, s);
        case 4:
            return score_in_place<4>(kb, kr, vrows, vr, q, d, s);
        case 5:
            return score_in_place<5>(kb, kr, vrows, vr, q, d, s);
        case 6:
            return score_in_place<6>(kb, kr, vrows, vr, q, d, s);
        case 7:
            return score_in_place<7>(kb, kr, vrows, vr, q, d, s);
        default:
            return score_in_place<8>(kb, kr, vrows, vr, q, d, s);
    }
}
#endif

// The converted blocks start at the first 64-byte boundary of the buffer (vector loads).
template <typename T>
T * aligned64(T * p) {
    return reinterpret_cast<T *>((reinterpret_cast<uintptr_t>(p) + 63) / 64 * 64);
}

}  // namespace

bool converts_ahead(const Problem & p) {
    return p.n_q > k_tile && p.chunk_rows % k_block == 0;
}

int64_t converted_floats(const Problem & p) {
    return int64_t(p.n_head_kv) * n_blocks(p) * block_floats(p.head_dim) + 64 / int64_t(sizeof(float));
}

void convert(const Problem & p, float * pre, int ith, int nth) {
    pre = aligned64(pre);
    const int64_t nb = n_blocks(p), bf = block_floats(p.head_dim);
    const int64_t low_rows = int64_t(p.low_chunks()) * p.chunk_rows;
    std::vector<float> row(size_t(block_floats(p.head_dim)));
    for (int64_t u = ith; u < int64_t(p.n_head_kv) * nb; u += nth) {
        const int g = int(u / nb);
        const int64_t r = (u % nb) * k_block;
        const Segment & sg = r < low_rows ? p.low[g] : p.seg[g];
        const int64_t b = r < low_rows ? r : r - low_rows;
        float * kt = pre + u * bf;
        convert_block(sg, p.head_dim, b, sg.n, kt, kt + int64_t(p.head_dim) * k_block, row.data());
    }
}

namespace {

// The units of thread ith of nth: a contiguous range of units (in the order tile, KV head,
// chunk) holding about 1/nth of the work. A unit's cost is estimated from the key rows its
// first and last query rows see in its chunk (they grow with the row, and causal units
// of late chunks see only part of theirs), plus the fixed cost of a unit. Which thread
// computes a unit never changes its result; balancing only removes the wait at the end
// (units dealt in turn gave one thread every even chunk: the last prefill chunk's
// diagonal units went all to one side).
int64_t n_units(const Problem & p) {
    return (p.n_q + k_tile - 1) / k_tile * p.n_head_kv * p.n_chunks();
}

// Appends the cumulative cost of each of p's units to prefix (which ends with the cost so far).
void add_unit_costs(const Problem & p, std::vector<double> & prefix) {
    const int32_t n_chunks = p.n_chunks();
    const int64_t n_tiles = (p.n_q + k_tile - 1) / k_tile;
    // the key rows [lo, vis) a query at position qp sees in segment sg
    auto seen = [&p](const Segment & sg, int32_t qp) {
        const int64_t vis = std::upper_bound(sg.pos, sg.pos + sg.n, qp) - sg.pos;
        const int64_t lo = p.window > 0 ? std::upper_bound(sg.pos, sg.pos + sg.n, qp - p.window) - sg.pos : 0;
        return std::pair<int64_t, int64_t>(lo, vis);
    };
    constexpr double k_unit_rows = 64.0;  // a unit's fixed cost, in key rows seen by its rows
    for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int64_t i0 = tile * k_tile, i1 = std::min<int64_t>(p.n_q, i0 + k_tile);
        for (int32_t g = 0; g < p.n_head_kv; ++g) {
            for (int32_t c = 0; c < n_chunks; ++c) {
                const auto [sg, cl] = p.chunk_run(g, c);
                const auto [lo0, vis0] = seen(*sg, p.q_pos[i0]);
                const auto [lo1, vis1] = seen(*sg, p.q_pos[i1 - 1]);
                const int64_t c0 = cl * p.chunk_rows, c1 = c0 + p.chunk_rows;
                auto in_chunk = [c0, c1](int64_t lo, int64_t vis) {
                    return double(std::max<int64_t>(0, std::min(vis, c1) - std::max(lo, c0)));
                };
                const double rows = 0.5 * (in_chunk(lo0, vis0) + in_chunk(lo1, vis1)) * double(i1 - i0);
                prefix.push_back(prefix.back() + rows + k_unit_rows);
            }
        }
    }
}

// Thread ith's share of the units whose cumulative costs are prefix ([0] = 0).
std::pair<int64_t, int64_t> split_units(const std::vector<double> & prefix, int ith, int nth) {
    const int64_t n = int64_t(prefix.size()) - 1;
    auto boundary = [&](int t) {  // the first unit whose work starts at or after t/nth of the total
        const double at = prefix.back() * double(t) / double(nth);
        return int64_t(std::lower_bound(prefix.begin(), prefix.end() - 1, at) - prefix.begin());
    };
    return {ith == 0 ? 0 : boundary(ith), ith + 1 == nth ? n : boundary(ith + 1)};
}

std::pair<int64_t, int64_t> unit_range(const Problem & p, int ith, int nth) {
    if (nth == 1) return {0, n_units(p)};
    std::vector<double> prefix = {0.0};
    prefix.reserve(size_t(n_units(p)) + 1);
    add_unit_costs(p, prefix);
    return split_units(prefix, ith, nth);
}

}  // namespace

int32_t Problem::low_chunks() const {
    int64_t rows = 0;
    for (const Segment & sg : low) rows = std::max(rows, sg.n);
    return int32_t((rows + chunk_rows - 1) / chunk_rows);
}

int32_t Problem::n_chunks() const {
    int64_t rows = 1;
    for (const Segment & sg : seg) rows = std::max(rows, sg.n);
    return low_chunks() + int32_t((rows + chunk_rows - 1) / chunk_rows);
}

std::pair<const Segment *, int32_t> Problem::chunk_run(int32_t g, int32_t c) const {
    const int32_t lc = low_chunks();
    return c < lc ? std::pair<const Segment *, int32_t>(&low[g], c)
                  : std::pair<const Segment *, int32_t>(&seg[g], c - lc);
}

namespace {

// One query vector's step over a block: the scores scaled and masked to lanes [na0, nb), the
// running max m and sum l and the accumulator rescaled, the scores turned into weights in place
// (exp's argument floored where expf stays normal: below, the vector expf leaves its fast path
// for a scalar call per lane; masked lanes hold k_no_max and are zeroed next; a weight under
// 2^-125 of the row's largest changes no sum). The first block has nothing to rescale (and no
// exp of -FLT_MAX to underflow).
inline void weigh_block(v16 (&sx)[k_kv], int na0, int nb, float scale, float & m, float & l, v16 * acc, int dv) {
    float * w = reinterpret_cast<float *>(sx);
    const float mb = scale_mask_max(sx, na0, nb, scale);
    if (mb > m && m == k_no_max) {
        m = mb;
    } else if (mb > m) {
        const float f = std::exp(m - mb);
        l *= f;
        for (int y = 0; y < dv; ++y) acc[y] *= f;
        m = mb;
    }
    const float mt = m;  // a local: the weights' stores could alias m and keep the exp loop scalar
    for (int j = 0; j < k_block; ++j) w[j] = std::exp(std::max(w[j] - mt, k_exp_floor));
    for (int j = 0; j < na0; ++j) w[j] = 0.0f;
    for (int j = nb; j < k_block; ++j) w[j] = 0.0f;
    l += sum_block(sx);
}

// A work unit is (tile of query rows, KV head, chunk of key rows). Each 64-row block of
// the chunk is converted to float32 once and reused by all the unit's query vectors
// (its rows times the heads of the GQA group), four at a time. The arithmetic of one
// query vector is a fixed sequence of vector operations over its own key rows: scores
// are FMA chains over d in order, masked lanes never reach the output, the block sums
// follow a fixed tree. Hence the result of a query row never depends on which rows
// share its unit, on the chunk size of the prefill or on the thread count.
// One function on purpose (longer than the usual 80 lines): the unit's score tile s[][]
// and its running maxima stay in registers across the block loop, and the fixed order of
// operations that makes the result invariant is visible in one place.
[[gnu::noinline]] void compute_tiles(const Problem & p, const float * q, int64_t q_head_stride, int64_t q_row_stride,
                                     float * partial, int64_t u_begin, int64_t u_end, const float * pre,
                                     Slice scratch) {
    const int d = p.head_dim;
    const int dv = (d + k_lanes - 1) / k_lanes;  // vectors per V row
    const int group = p.n_head / p.n_head_kv;
    const int32_t n_chunks = p.n_chunks();
    const int64_t chunk_stride = int64_t(p.n_q) * p.n_head * (d + 2);
    const int max_vecs = k_tile * group;
    const int64_t n_pre_blocks = pre ? n_blocks(p) : 0, pre_block = block_floats(d);
    const int32_t low_chunks = p.low_chunks();
    if (pre) pre = aligned64(pre);
    KVLAB_ASSERT(!pre || p.chunk_rows % k_block == 0, "blocks converted ahead start at multiples of k_block");

    Scratch sc(scratch, d, max_vecs);
    KVLAB_ASSERT(group <= k_max_group, "the engine refuses GQA groups beyond the kernel's limit");
    int64_t first[k_tile * k_max_group], visible[k_tile * k_max_group];
    const float * qv[k_tile * k_max_group];
    int active[k_tile * k_max_group];

    for (int64_t u = u_begin; u < u_end; ++u) {
        const int32_t c = int32_t(u % n_chunks);
        const int32_t g = int32_t((u / n_chunks) % p.n_head_kv);
        const int64_t i0 = (u / (int64_t(n_chunks) * p.n_head_kv)) * k_tile;
        const int64_t i1 = std::min<int64_t>(p.n_q, i0 + k_tile);
        const auto [run, cl] = p.chunk_run(g, c);  // the chunk's run (demoted or not) and its index there
        const Segment & sg = *run;
        const int64_t pre_base = c < low_chunks ? 0 : int64_t(low_chunks) * p.chunk_rows;  // run's first block row
        const int64_t r0 = std::min(sg.n, cl * p.chunk_rows);
        int64_t r_end = r0, r_begin = std::min(sg.n, (cl + 1) * p.chunk_rows);
        int nv = 0;  // query vectors of the unit: (row i, head qh) in row-major order
        for (int64_t i = i0; i < i1; ++i) {
            // the query's rows in this chunk: [start, lim) (a window drops the rows before start)
            const int64_t vis = std::upper_bound(sg.pos, sg.pos + sg.n, p.q_pos[i]) - sg.pos;
            const int64_t lo =
                p.window > 0 ? std::upper_bound(sg.pos, sg.pos + sg.n, p.q_pos[i] - p.window) - sg.pos : 0;
            const int64_t start = std::max(r0, lo);
            const int64_t lim = std::max(start, std::min(vis, (cl + 1) * p.chunk_rows));
            r_end = std::max(r_end, lim);
            if (lim > start) r_begin = std::min(r_begin, start);
            for (int qh = g * group; qh < (g + 1) * group; ++qh, ++nv) {
                first[nv] = start;
                visible[nv] = lim;
                qv[nv] = q + i * q_row_stride + qh * q_head_stride;
                std::fill(&sc.acc[size_t(nv) * dv], &sc.acc[size_t(nv + 1) * dv], v16{});
                sc.m[nv] = k_no_max;
                sc.l[nv] = 0.0f;
            }
        }
        // blocks stay at their offsets from the chunk's start (the arithmetic of a row never
        // depends on which rows before it are out of every query's window)
        for (int64_t b = r0 + (std::max(r0, std::min(r_begin, r_end)) - r0) / k_block * k_block; b < r_end;
             b += k_block) {
            // the block in float32: converted ahead for all tiles (rows past r_end then hold
            // their values, which only masked lanes and zero weights ever meet), or here
            const v16 * ktv = sc.kt;
            const v16 * vbv = sc.vb;
            if (pre) {
                const float * blk = pre + (int64_t(g) * n_pre_blocks + (pre_base + b) / k_block) * pre_block;
                ktv = reinterpret_cast<const v16 *>(blk);
                vbv = reinterpret_cast<const v16 *>(blk + int64_t(d) * k_block);
            } else {
                convert_block(sg, d, b, r_end, reinterpret_cast<float *>(sc.kt), reinterpret_cast<float *>(sc.vb),
                              sc.row);
            }
            int na = 0;
            for (int t = 0; t < nv; ++t)
                if (visible[t] > b && first[t] < b + k_block && first[t] < visible[t]) active[na++] = t;
            for (int a0 = 0; a0 < na; a0 += k_mq) {
                const int mq = std::min(k_mq, na - a0);
                const float * qs[k_mq];
                for (int x = 0; x < mq; ++x) qs[x] = qv[active[a0 + x]];
                v16 s[k_mq][k_kv];
                score_any(mq, ktv, qs, d, s);
                int nb_max = 0;
                v16 * accs[k_mq];
                const float * ws[k_mq];
                for (int x = 0; x < mq; ++x) {
                    const int t = active[a0 + x];
                    const int nb = int(std::min<int64_t>(k_block, visible[t] - b));
                    const int na0 = int(std::max<int64_t>(0, first[t] - b));  // lanes before the window
                    nb_max = std::max(nb_max, nb);
                    v16 * acc = &sc.acc[size_t(t) * dv];
                    weigh_block(s[x], na0, nb, p.scale, sc.m[t], sc.l[t], acc, dv);
                    accs[x] = acc;
                    ws[x] = reinterpret_cast<const float *>(s[x]);
                }
                accumulate_any(mq, dv, accs, ws, vbv, nb_max);
            }
        }
        int t = 0;
        for (int64_t i = i0; i < i1; ++i)
            for (int qh = g * group; qh < (g + 1) * group; ++qh, ++t) {
                float * o = partial + c * chunk_stride + (i * p.n_head + qh) * (d + 2);
                std::memcpy(o, &sc.acc[size_t(t) * dv], size_t(d) * sizeof(float));
                o[d] = sc.m[t];
                o[d + 1] = sc.l[t];
            }
    }
}

// compute() for a decode: one query row whose GQA group fits two micro-tiles (up to
// k_decode_vecs query heads per KV head), no blocks converted ahead. F16 rows are read where they
// are stored (K: score_in_place for whole blocks, one transposed tile for the whole group; V:
// accumulate_half, head_dim up to 64) instead of being converted into the scratch. The same
// operations in the same order as compute_tiles (the same bits, tested). A function of its own:
// the prefill's loop in compute_tiles ran 3-5% slower on gemma3-270m (head_dim 256) with these
// paths inside it (AMD EPYC Zen 5, GCC 12).
[[gnu::noinline]] void compute_decode(const Problem & p, const float * q, int64_t q_head_stride, float * partial,
                                      int64_t u_begin, int64_t u_end, Slice scratch) {
    const int d = p.head_dim;
    const int dv = (d + k_lanes - 1) / k_lanes;
    const int group = p.n_head / p.n_head_kv;
    const int32_t n_chunks = p.n_chunks();
    const int64_t chunk_stride = int64_t(p.n_head) * (d + 2);
    Scratch sc(scratch, d, group);
    float m[k_decode_vecs], l[k_decode_vecs];
    const float * qs[k_decode_vecs];
    v16 * accs[k_decode_vecs];
    const float * ws[k_decode_vecs];
    for (int64_t u = u_begin; u < u_end; ++u) {
        const int32_t c = int32_t(u % n_chunks);
        const int32_t g = int32_t((u / n_chunks) % p.n_head_kv);
        const auto [run, cl] = p.chunk_run(g, c);
        const Segment & sg = *run;
        const int64_t r0 = std::min(sg.n, cl * p.chunk_rows);
        const int64_t vis = std::upper_bound(sg.pos, sg.pos + sg.n, p.q_pos[0]) - sg.pos;
        const int64_t lo = p.window > 0 ? std::upper_bound(sg.pos, sg.pos + sg.n, p.q_pos[0] - p.window) - sg.pos : 0;
        const int64_t start = std::max(r0, lo);
        const int64_t lim = std::max(start, std::min(vis, (cl + 1) * p.chunk_rows));
        const int64_t r_end = std::max(r0, lim);
        const int64_t r_begin = lim > start ? start : std::min(sg.n, (cl + 1) * p.chunk_rows);
        for (int x = 0; x < group; ++x) {
            qs[x] = q + (int64_t(g) * group + x) * q_head_stride;
            accs[x] = &sc.acc[size_t(x) * dv];
            std::fill(accs[x], accs[x] + dv, v16{});
            m[x] = k_no_max;
            l[x] = 0.0f;
        }
        const bool v_in_place = half_rows(sg, d);
        for (int64_t b = r0 + (std::max(r0, std::min(r_begin, r_end)) - r0) / k_block * k_block; b < r_end;
             b += k_block) {
            if (!(lim > b && start < b + k_block && start < lim)) continue;  // no vector sees the block
            const bool k_in_place = v_in_place && sg.k_type == GGML_TYPE_F16 && r_end - b >= k_block;
            if (!k_in_place)
                convert_block(sg, d, b, r_end, reinterpret_cast<float *>(sc.kt),
                              v_in_place ? nullptr : reinterpret_cast<float *>(sc.vb), sc.row);
            v16 s[k_decode_vecs][k_kv];
#if defined(__AVX512F__)
            if (k_in_place)
                score_in_place_any(group, static_cast<const uint8_t *>(sg.k) + size_t(b) * d * 2, size_t(d) * 2,
                                   static_cast<const uint8_t *>(sg.v) + size_t(b) * d * 2, size_t(d) * 2, qs, d, s);
            else
#endif
                for (int a0 = 0; a0 < group; a0 += k_mq)
                    score_any(std::min(k_mq, group - a0), sc.kt, qs + a0, d,
                              *reinterpret_cast<v16(*)[k_mq][k_kv]>(s + a0));
            const int nb = int(std::min<int64_t>(k_block, lim - b));
            const int na0 = int(std::max<int64_t>(0, start - b));
            for (int x = 0; x < group; ++x) {
                weigh_block(s[x], na0, nb, p.scale, m[x], l[x], accs[x], dv);
                ws[x] = reinterpret_cast<const float *>(s[x]);
            }
            for (int a0 = 0; a0 < group; a0 += k_mq) {  // micro-tiles of k_mq vectors
                const int mq = std::min(k_mq, group - a0);
#if defined(__AVX512F__)
                if (v_in_place) {
                    accumulate_half_any(mq, dv, accs + a0, ws + a0,
                                        static_cast<const ggml_fp16_t *>(sg.v) + size_t(b) * d, nb);
                    continue;
                }
#endif
                accumulate_any(mq, dv, accs + a0, ws + a0, sc.vb, nb);
            }
        }
        for (int x = 0; x < group; ++x) {
            float * o = partial + c * chunk_stride + (int64_t(g) * group + x) * (d + 2);
            std::memcpy(o, accs[x], size_t(d) * sizeof(float));
            o[d] = m[x];
            o[d + 1] = l[x];
        }
    }
}

}  // namespace

SliceSize compute_scratch(const Problem & p) {  // a unit's query vectors: a group, or a tile's groups
    const int group = p.n_head / p.n_head_kv;
    return Scratch::size(p.head_dim, decodes(p, converts_ahead(p)) ? group : k_tile * group);
}

namespace {

void compute_units(const Problem & p, const float * q, int64_t q_head_stride, int64_t q_row_stride, float * partial,
                   int64_t u_begin, int64_t u_end, const float * pre, Slice scratch) {
    if (u_begin >= u_end) return;
    if (decodes(p, pre != nullptr)) return compute_decode(p, q, q_head_stride, partial, u_begin, u_end, scratch);
    compute_tiles(p, q, q_head_stride, q_row_stride, partial, u_begin, u_end, pre, scratch);
}

}  // namespace

void compute(const Problem & p, const float * q, int64_t q_head_stride, int64_t q_row_stride, float * partial, int ith,
             int nth, const float * pre, Slice scratch) {
    const auto [u_begin, u_end] = unit_range(p, ith, nth);
    compute_units(p, q, q_head_stride, q_row_stride, partial, u_begin, u_end, pre, scratch);
}

size_t partial_floats(const Problem & p) {
    return size_t(p.head_dim + 2) * size_t(p.n_head) * size_t(p.n_q) * size_t(p.n_chunks());
}

SliceSize Batch::scratch() const {
    size_t most = 0;
    for (const Problem * p : problems) most = std::max(most, compute_scratch(*p).bytes());
    return SliceSize().add<uint8_t>(most);
}

void compute_batch(const Batch & b, const float * q, int64_t q_head_stride, int64_t q_row_stride, float * partial,
                   int ith, int nth, Slice scratch) {
    // the units of every problem, one after the other, split by their cost as one problem's are
    std::vector<double> prefix = {0.0};
    std::vector<int64_t> first = {0};
    for (const Problem * p : b.problems) {
        add_unit_costs(*p, prefix);
        first.push_back(int64_t(prefix.size()) - 1);
    }
    const auto [g_begin, g_end] = split_units(prefix, ith, nth);
    size_t at = 0;
    for (size_t i = 0; i < b.problems.size(); ++i) {
        const Problem & p = *b.problems[i];
        const int64_t u_begin = std::clamp(g_begin, first[i], first[i + 1]) - first[i];
        const int64_t u_end = std::clamp(g_end, first[i], first[i + 1]) - first[i];
        compute_units(p, q + b.row0[i] * q_row_stride, q_head_stride, q_row_stride, partial + at, u_begin, u_end,
                      nullptr, scratch);
        at += partial_floats(p);
    }
}

void merge_batch(const Batch & b, const float * partial, float * out, int ith, int nth) {
    size_t at = 0;
    for (size_t i = 0; i < b.problems.size(); ++i) {
        const Problem & p = *b.problems[i];
        merge(p, partial + at, out + b.row0[i] * p.n_head * p.head_dim, ith, nth);
        at += partial_floats(p);
    }
}

void merge(const Problem & p, const float * partial, float * out, int ith, int nth) {
    const int d = p.head_dim;
    const int64_t n_rows = int64_t(p.n_q) * p.n_head;
    const int64_t split_stride = n_rows * (d + 2);
    const int32_t n_chunks = p.n_chunks();
    // a contiguous range of rows per thread: each reads only its own rows' lines of partial
    for (int64_t r = n_rows * ith / nth, r_end = n_rows * (ith + 1) / nth; r < r_end; ++r) {
        float m = k_no_max;
        for (int s = 0; s < n_chunks; ++s) {
            const float * ps = partial + s * split_stride + r * (d + 2);
            if (ps[d + 1] > 0.0f) m = std::max(m, ps[d]);
        }
        float * o = out + r * d;
        std::fill(o, o + d, 0.0f);
        float l = 0.0f;
        for (int s = 0; s < n_chunks; ++s) {
            const float * ps = partial + s * split_stride + r * (d + 2);
            if (ps[d + 1] <= 0.0f) continue;
            const float f = std::exp(ps[d] - m);
            l += f * ps[d + 1];
            for (int j = 0; j < d; ++j) o[j] += f * ps[j];
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int j = 0; j < d; ++j) o[j] *= inv;
    }
}

namespace {

// src: q, the blocks converted ahead (when converts_ahead), the graph's scratch, the writes.
void op_compute(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const Problem & p = *static_cast<const Problem *>(userdata);
    const ggml_tensor * q = dst->src[0];
    const bool ahead = converts_ahead(p);
    const float * pre = ahead ? static_cast<const float *>(dst->src[1]->data) : nullptr;
    compute(p, static_cast<const float *>(q->data), int64_t(q->nb[1] / sizeof(float)),
            int64_t(q->nb[2] / sizeof(float)), static_cast<float *>(dst->data), ith, nth, pre,
            thread_slice(dst->src[ahead ? 2 : 1], compute_scratch(p).bytes(), ith, nth));
}

// src: q, the graph's scratch, the writes.
void op_compute_batch(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const Batch & b = *static_cast<const Batch *>(userdata);
    const ggml_tensor * q = dst->src[0];
    compute_batch(b, static_cast<const float *>(q->data), int64_t(q->nb[1] / sizeof(float)),
                  int64_t(q->nb[2] / sizeof(float)), static_cast<float *>(dst->data), ith, nth,
                  thread_slice(dst->src[1], b.scratch().bytes(), ith, nth));
}

void op_merge_batch(ggml_tensor * dst, int ith, int nth, void * userdata) {
    merge_batch(*static_cast<const Batch *>(userdata), static_cast<const float *>(dst->src[0]->data),
                static_cast<float *>(dst->data), ith, nth);
}

void op_convert(ggml_tensor * dst, int ith, int nth, void * userdata) {
    convert(*static_cast<const Problem *>(userdata), static_cast<float *>(dst->data), ith, nth);
}

void op_merge(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const Problem & p = *static_cast<const Problem *>(userdata);
    merge(p, static_cast<const float *>(dst->src[0]->data), static_cast<float *>(dst->data), ith, nth);
}

}  // namespace

ggml_tensor * build(ggml_context * ctx, ggml_tensor * q, const Problem * p, const std::vector<ggml_tensor *> & deps,
                    GraphScratch & scratch) {
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float));
    void * ud = const_cast<Problem *>(p);
    std::vector<ggml_tensor *> args = {q};
    if (converts_ahead(*p)) {  // K and V in float32 once, before the units that read them
        std::vector<ggml_tensor *> cdeps(deps.begin(), deps.begin() + std::min<size_t>(deps.size(), GGML_MAX_SRC - 1));
        if (cdeps.empty()) cdeps.push_back(q);  // a custom op needs a source
        args.push_back(ggml_set_name(ggml_custom_4d(ctx, GGML_TYPE_F32, converted_floats(*p), 1, 1, 1, cdeps.data(),
                                                    int(cdeps.size()), op_convert, GGML_N_TASKS_MAX, ud),
                                     "attention convert"));
    }
    args.push_back(scratch.need(compute_scratch(*p).bytes()));
    for (ggml_tensor * t : deps)
        if (args.size() + 1 < GGML_MAX_SRC) args.push_back(t);  // ggml_custom_4d takes fewer than GGML_MAX_SRC
    ggml_tensor * part = ggml_custom_4d(ctx, GGML_TYPE_F32, p->head_dim + 2, p->n_head, p->n_q, p->n_chunks(),
                                        args.data(), int(args.size()), op_compute, GGML_N_TASKS_MAX, ud);
    ggml_set_name(part, "attention");
    return ggml_set_name(
        ggml_custom_4d(ctx, GGML_TYPE_F32, p->head_dim, p->n_head, p->n_q, 1, &part, 1, op_merge, GGML_N_TASKS_MAX, ud),
        "attention merge");
}

ggml_tensor * build_batch(ggml_context * ctx, ggml_tensor * q, const Batch * b, const std::vector<ggml_tensor *> & deps,
                          GraphScratch & scratch) {
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float));
    KVLAB_ASSERT(!b->problems.empty() && b->problems.size() == b->row0.size(), "a batch has a row offset per problem");
    const Problem & p0 = *b->problems[0];
    size_t floats = 0;
    for (size_t i = 0; i < b->problems.size(); ++i) {
        const Problem & p = *b->problems[i];
        KVLAB_ASSERT(p.n_head == p0.n_head && p.head_dim == p0.head_dim && b->row0[i] + p.n_q <= q->ne[2],
                     "a batch's problems share q's shape and lie within its rows");
        floats += partial_floats(p);
    }
    void * ud = const_cast<Batch *>(b);
    // the writes as sources while ggml takes them (fewer than GGML_MAX_SRC): they are in the graph
    // before this node already, and ggml computes the nodes in that order; the sources add the order
    // for the allocator and for readers of the graph
    std::vector<ggml_tensor *> args = {q, scratch.need(b->scratch().bytes())};
    for (ggml_tensor * t : deps)
        if (args.size() + 1 < GGML_MAX_SRC) args.push_back(t);
    ggml_tensor * part = ggml_custom_4d(ctx, GGML_TYPE_F32, int64_t(floats), 1, 1, 1, args.data(), int(args.size()),
                                        op_compute_batch, GGML_N_TASKS_MAX, ud);
    ggml_set_name(part, "attention");
    return ggml_set_name(ggml_custom_4d(ctx, GGML_TYPE_F32, p0.head_dim, p0.n_head, q->ne[2], 1, &part, 1,
                                        op_merge_batch, GGML_N_TASKS_MAX, ud),
                         "attention merge");
}

}  // namespace kvlab::kernels::attn
