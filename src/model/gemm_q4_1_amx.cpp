#include "model/gemm_q4_1_amx.h"

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
#include "kvlab/error.h"
#include "kvlab/model.h"
#include "model/packed_product.h"
#include "model/vnni.h"

#if defined(KVLAB_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#define KVLAB_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvlab::gemm_amx {

namespace {

constexpr int64_t k_qk = 32;      // values per block (QK4_1 = QK8_1)
constexpr size_t k_w_block = 20;  // block_q4_1: f16 d, f16 m, 16 bytes of nibbles
constexpr int k_panel = 16;       // weight rows per panel: one AMX tile's columns, one zmm's lanes
constexpr int k_rows = 16;        // activation rows per AMX tile

int64_t padded_rows(int64_t M) {
    return M < k_min_batch ? M : (M + k_rows - 1) / k_rows * k_rows;
}

// The packed activations, M rows padded to Mp (padded_rows), nb blocks each:
//   qs: [Mp][K] int8, a row's blocks' values end to end (an AMX tile reads 16 rows x 32 bytes)
//   d, s: [nb][Mp] float: the blocks' f16 scale and sum, converted; 0 in padded rows
struct Packed {
    const int8_t * qs;
    const float * d;
    const float * s;
    Packed(const uint8_t * p, int64_t K, int64_t Mp)
        : qs(reinterpret_cast<const int8_t *>(p)),
          d(reinterpret_cast<const float *>(p + Mp * K)),
          s(d + K / k_qk * Mp) {}
};

std::atomic<int> g_mode{-1};  // -1: not chosen yet (auto)

}  // namespace

size_t packed_bytes(int64_t K, int64_t M) {
    const int64_t Mp = padded_rows(M);
    return size_t(Mp * K + 2 * (K / k_qk) * Mp * int64_t(sizeof(float)));
}

#ifdef KVLAB_AMX

namespace {

// ggml's quantize_row_q8_1 (ggml-cpu/arch/x86/quants.c) for one block, written where this
// kernel reads it: the same operations on every value (max |x| exact in any order, d = max / 127
// and id = 127 / max in float, x * id rounded to nearest even, d and d * sum(q) rounded to f16),
// so the same bytes, 16 values per instruction instead of 8.
inline void quantize_block(const float * x, int8_t * q, float * d, float * s) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float dv = max / 127.f;
    const float id = max != 0.0f ? 127.f / max : 0.0f;
    const __m512 mul = _mm512_set1_ps(id);
    const __m512i i0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT));
    const __m512i i1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(q), _mm512_cvtsepi32_epi8(i0));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(q + 16), _mm512_cvtsepi32_epi8(i1));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    *d = _cvtsh_ss(_cvtss_sh(dv, _MM_FROUND_TO_NEAREST_INT));
    *s = _cvtsh_ss(_cvtss_sh(dv * float(sum), _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace

// Rows in contiguous ranges per thread (the d and s arrays are [block][row]: interleaved rows
// would share their cache lines between threads).
void pack(const float * x, int64_t K, int64_t M, int64_t x_stride, uint8_t * packed, int ith, int nth) {
    const int64_t nb = K / k_qk, Mp = padded_rows(M);
    int8_t * qs = reinterpret_cast<int8_t *>(packed);
    float * d = reinterpret_cast<float *>(packed + Mp * K);
    float * s = d + nb * Mp;
    for (int64_t m = Mp * ith / nth; m < Mp * (ith + 1) / nth; ++m) {
        if (m >= M) {
            std::memset(qs + m * K, 0, size_t(K));
            for (int64_t ib = 0; ib < nb; ++ib) d[ib * Mp + m] = s[ib * Mp + m] = 0.0f;
            continue;
        }
        for (int64_t ib = 0; ib < nb; ++ib)
            quantize_block(x + m * x_stride + ib * k_qk, qs + m * K + ib * k_qk, &d[ib * Mp + m], &s[ib * Mp + m]);
    }
}

namespace {

// One block of 16 weight rows (rows past R are zero) in the layout of an AMX B tile: 8 vectors,
// vector G holding values 4G..4G+3 of weight rows 0..15 as u8 (lane n: row n), which is also
// what VNNI multiplies by an activation's 4 values broadcast; and the 16 rows' scales and minima.
struct Block {
    __m512i q[8];
    __m512 d, m;
};

inline void load_block(const uint8_t * w, size_t w_row_bytes, int R, int64_t ib, Block & out) {
    // dword g of 4 rows' 16 nibble bytes (one row per 128-bit lane) -> lane g: dword g of the 4 rows
    const __m512i tr = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    const __m512i low = _mm512_set1_epi8(0x0F);
    alignas(64) uint32_t dm[16];  // the rows' f16 (d, m) pairs
    __m512i z[4];
    for (int j = 0; j < 4; ++j) {
        __m128i lane[4];
        for (int r = 0; r < 4; ++r) {
            const int n = 4 * j + r;
            if (n < R) {
                const uint8_t * b = w + size_t(n) * w_row_bytes + ib * k_w_block;
                vnni::prefetch_ahead(b);
                lane[r] = _mm_loadu_si128(reinterpret_cast<const __m128i *>(b + 4));
                std::memcpy(&dm[n], b, 4);
            } else {
                lane[r] = _mm_setzero_si128();
                dm[n] = 0;
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
    const __m512i o[4] = {_mm512_shuffle_i32x4(lo01, lo23, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(lo01, lo23, _MM_SHUFFLE(3, 1, 3, 1)),
                          _mm512_shuffle_i32x4(hi01, hi23, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(hi01, hi23, _MM_SHUFFLE(3, 1, 3, 1))};
    for (int g = 0; g < 4; ++g) {  // values 4g.. are the low nibbles of bytes 4g.., values 16 + 4g.. the high ones
        out.q[g] = _mm512_and_si512(o[g], low);
        out.q[g + 4] = _mm512_and_si512(_mm512_srli_epi16(o[g], 4), low);
    }
    const __m512 a = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(dm)));
    const __m512 b = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(dm + 8)));
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    out.d = _mm512_permutex2var_ps(a, even, b);
    out.m = _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b);
}

// A panel of 16 weight rows unpacked for the AMX tiles: per block the 8 vectors end to end (one
// B tile), and the scales and minima, [nb][16] each.
struct Panel {
    std::vector<uint8_t> q;   // [nb][8][64]
    std::vector<float> d, m;  // [nb][16]

    void unpack(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb) {
        q.resize(size_t(nb) * 512);
        d.resize(size_t(nb) * k_panel);
        m.resize(size_t(nb) * k_panel);
        Block blk;
        for (int64_t ib = 0; ib < nb; ++ib) {
            load_block(w, w_row_bytes, R, ib, blk);
            for (int g = 0; g < 8; ++g) _mm512_storeu_si512(&q[size_t(ib) * 512 + g * 64], blk.q[g]);
            _mm512_storeu_ps(&d[ib * k_panel], blk.d);
            _mm512_storeu_ps(&m[ib * k_panel], blk.m);
        }
    }
};

// The per-block step every output takes, from the block's exact integer sum (one lane per weight
// row): acc = fma(d_w * d_y, float(sum), acc), then acc = fma(m_w, s_y, acc).
inline __m512 step(__m512 acc, __m512i sum, __m512 dw, __m512 mw, float dy, float sy) {
    acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dy)), _mm512_cvtepi32_ps(sum), acc);
    return _mm512_fmadd_ps(mw, _mm512_set1_ps(sy), acc);
}

void store(float * dst, __m512 v, int R) {
    _mm512_mask_storeu_ps(dst, __mmask16((1u << R) - 1), v);
}

// Fewer than k_min_batch activation rows (decode) against 16 weight rows: each block unpacked
// into registers once for all rows, its sums by VNNI (8 instructions of 16 rows x 4 values).
void rows_vnni(const uint8_t * w, size_t w_row_bytes, int R, int64_t nb, const Packed & y, int64_t M, int64_t K,
               float * dst, int64_t dst_stride) {
    __m512 acc[k_min_batch];
    for (int64_t mrow = 0; mrow < M; ++mrow) acc[mrow] = _mm512_setzero_ps();
    Block blk;
    for (int64_t ib = 0; ib < nb; ++ib) {
        load_block(w, w_row_bytes, R, ib, blk);
        for (int64_t mrow = 0; mrow < M; ++mrow) {
            int32_t g4[8];
            std::memcpy(g4, y.qs + mrow * K + ib * k_qk, 32);
            __m512i sum = _mm512_setzero_si512();
            for (int g = 0; g < 8; ++g) sum = _mm512_dpbusd_epi32(sum, blk.q[g], _mm512_set1_epi32(g4[g]));
            acc[mrow] = step(acc[mrow], sum, blk.d, blk.m, y.d[ib * M + mrow], y.s[ib * M + mrow]);
        }
    }
    for (int64_t mrow = 0; mrow < M; ++mrow) store(dst + mrow * dst_stride, acc[mrow], R);
}

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
                    const __m512 dw = _mm512_loadu_ps(&p_.d[ib * k_panel]), mw = _mm512_loadu_ps(&p_.m[ib * k_panel]);
                    const float * dy = y_.d + ib * Mp_ + m0 + r;
                    const float * sy = y_.s + ib * Mp_ + m0 + r;
                    a0 = step(a0, _mm512_load_si512(c), dw, mw, dy[0], sy[0]);
                    a1 = step(a1, _mm512_load_si512(c + 16), dw, mw, dy[1], sy[1]);
                    a2 = step(a2, _mm512_load_si512(c + 32), dw, mw, dy[2], sy[2]);
                    a3 = step(a3, _mm512_load_si512(c + 48), dw, mw, dy[3], sy[3]);
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

}  // namespace

bool available() {
    static const bool ok = request_tiles();
    return ok;
}

void product(const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N, const uint8_t * packed, int64_t M,
             float * dst, int64_t dst_stride, int ith, int nth) {
    const int64_t nb = K / k_qk, Mp = padded_rows(M);
    const Packed y(packed, K, Mp);
    const int64_t n_panels = (N + k_panel - 1) / k_panel;
    const int64_t p0 = n_panels * ith / nth, p1 = n_panels * (ith + 1) / nth;
    if (p0 == p1) return;
    const bool tiles = M >= k_min_batch;
    if (tiles) {
        static const TileConfig cfg;
        _tile_loadconfig(&cfg);
    }
    thread_local Panel panel;
    thread_local PanelProduct::Sums sums[2];
    for (int64_t ip = p0; ip < p1; ++ip) {
        const int64_t n0 = ip * k_panel;
        const int R = int(std::min<int64_t>(k_panel, N - n0));
        if (!tiles) {
            rows_vnni(w + n0 * w_row_bytes, w_row_bytes, R, nb, y, M, K, dst + n0, dst_stride);
            continue;
        }
        panel.unpack(w + n0 * w_row_bytes, w_row_bytes, R, nb);
        PanelProduct(panel, nb, y, Mp, K, sums).run(dst + n0, dst_stride, M, R);
    }
    if (tiles) _tile_release();
}

#else

bool available() {
    return false;
}

void pack(const float *, int64_t, int64_t, int64_t, uint8_t *, int, int) {}
void product(const uint8_t *, size_t, int64_t, int64_t, const uint8_t *, int64_t, float *, int64_t, int, int) {}

#endif

Mode parse_mode(const std::string & name) {
    if (name == "ggml") return Mode::ggml;
    if (name == "auto") return available() ? Mode::amx : Mode::ggml;
    if (name == "amx") {
        if (!available())
            throw Error("cli",
                        "--products amx: this CPU or kernel has no AMX-INT8 tiles (or kvlab was built without "
                        "them); use auto or ggml");
        return Mode::amx;
    }
    throw Error("cli", "--products takes auto, ggml or amx, got '" + name + "'");
}

const char * mode_name(Mode m) {
    return m == Mode::amx ? "amx" : "ggml";
}

void set_mode(Mode m) {
    g_mode.store(int(m));
}

Mode mode() {
    const int m = g_mode.load();
    if (m >= 0) return Mode(m);
    return available() ? Mode::amx : Mode::ggml;
}

namespace {
constexpr gemm_common::PackedProduct k_kernel = {pack, gemm_common::product_of<product>};
}  // namespace

bool applies(const ggml_tensor * w, const ggml_tensor * x) {
    return mode() == Mode::amx && w->type == GGML_TYPE_Q4_1 && gemm_common::plain_operands(w, x, k_qk);
}

ggml_tensor * mul_mat(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    return gemm_common::packed_product(ctx, w, x, packed_bytes(x->ne[0], x->ne[1]), k_kernel);
}

void mul_mats(ggml_context * ctx, ggml_tensor * const * w, ggml_tensor ** out, int n, ggml_tensor * x) {
    ggml_tensor * packed = gemm_common::pack_node(ctx, x, packed_bytes(x->ne[0], x->ne[1]), k_kernel);
    for (int i = 0; i < n; ++i) out[i] = gemm_common::product_node(ctx, w[i], packed, x, k_kernel);
}

}  // namespace kvlab::gemm_amx

namespace kvlab {

void set_products(const std::string & name) {
    gemm_amx::set_mode(gemm_amx::parse_mode(name));
}

const char * products_name() {
    return gemm_amx::mode_name(gemm_amx::mode());
}

}  // namespace kvlab
