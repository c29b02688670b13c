// The block order on Intel AMX (block_order.h): per 16 activation rows x block, one TDPBSUD gives
// the 16 x 16 exact integer block sums while the vector units apply the previous blocks' steps
// (PanelProduct). amx_kernel() runs batches of k_min_batch rows and more on the tiles, fewer rows
// and Q6_K's batches by VNNI (product_vnni.cpp). Also here: the product over a thread's panels
// for both kernels (product_with) and the weights' panels (pack_panels, panel_rows).

// GCC 12 reads the self-initialized value of _mm512_undefined_*() inside the intrinsics as
// "maybe uninitialized" once they are inlined here: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "kernels/block_order.h"
#include "kernels/block_types.h"
#include "kernels/products.h"
#include "kvlab/error.h"

#ifdef KVLAB_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvlab::kernels::block {

#ifdef KVLAB_BLOCK_VNNI

namespace {

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
    // sums: two buffers of k_unit_sums ([k_unit_blocks][16 rows][16]) in the thread's scratch
    PanelProduct(const Panel & p, int64_t nb, const Packed & y, int64_t Mp, int64_t K, Slice & scratch)
        : p_(p),
          y_(y),
          nb_(nb),
          Mp_(Mp),
          K_(K),
          per_tile_((nb + k_unit_blocks - 1) / k_unit_blocks),
          sums_{scratch.take<int32_t>(k_unit_sums), scratch.take<int32_t>(k_unit_sums)} {}

    void run(float * dst, int64_t dst_stride, int64_t M, int R) {
        std::atomic_signal_fence(std::memory_order_seq_cst);  // the tile loads read what the unpack wrote
        const int64_t n_units = Mp_ / k_rows * per_tile_;
        issue(0, 0, 1);
        for (int64_t u = 0; u < n_units; ++u) {
            const int64_t m0 = u / per_tile_ * k_rows;
            const auto [ib0, ib1] = blocks(u);
            const bool first = ib0 == 0, last = ib1 == nb_;
            const int32_t * sums = sums_[u % 2];
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
        int32_t * sums = sums_[u % 2];
        for (int64_t i = n * part / parts; i < n * (part + 1) / parts; ++i)
            block_sums(p_, y_, K_, m0, ib0 + i, sums + i * k_rows * 16);
    }

    const Panel & p_;
    const Packed & y_;
    const int64_t nb_, Mp_, K_, per_tile_;
    int32_t * sums_[2];
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
                const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith, int nth, Slice & scratch) {
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
    Panel panel(scratch, nb);
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
        PanelProduct<W> product(panel, nb, y, Mp, K, scratch);
        for (int64_t ip = p0; ip < p1; ++ip) {
            const int64_t n0 = ip * k_panel;
            const int R = int(std::min<int64_t>(k_panel, N - n0));
            unpack(n0, R);
            product.run(dst + n0, dst_stride, M, R);
        }
        _tile_release();
    }
#else
    throw Error("internal", "[products] amx: a batch of " + std::to_string(M) + " rows needs the AMX tiles");
#endif
}

bool available() {
#ifdef KVLAB_AMX
    static const bool ok = request_tiles();
    return ok;
#else
    return false;
#endif
}

}  // namespace

void product_with(bool tiles, bool panels, ggml_type type, const uint8_t * w, size_t w_row_bytes, int64_t K, int64_t N,
                  const uint8_t * packed, int64_t M, float * dst, int64_t dst_stride, int ith, int nth,
                  Slice & scratch) {
    switch (type) {
        case GGML_TYPE_Q4_1:
            return product_of<Q4_1>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
        case GGML_TYPE_Q5_0:
            return product_of<Q5_0>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
        case GGML_TYPE_Q8_0:
            return product_of<Q8_0>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
        case GGML_TYPE_Q4_K:
            return product_of<Q4_K>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
        case GGML_TYPE_Q6_K:
            return product_of<Q6_K>(tiles, panels, w, w_row_bytes, K, N, packed, M, dst, dst_stride, ith, nth, scratch);
        default:
            throw Error("internal", std::string("[products] block order: no kernel for ") + ggml_type_name(type));
    }
}

namespace {

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

}  // namespace

#else

namespace {

bool available() {
    return false;
}

void q8_0_panel_row(const uint8_t *, size_t, int64_t, int64_t, float *) {}
bool panels_fit(const ggml_tensor *) {
    return false;
}
void pack_panels_in_place(ggml_tensor *) {}

}  // namespace

#endif

}  // namespace kvlab::kernels::block

namespace kvlab::kernels {

const ProductKernel & amx_kernel(bool panels) {
    using namespace block;
    static const ProductKernel k = {
        "amx", k_min_batch,         available, supports, packed_bytes, pack_scratch, product_scratch<true>,
        pack,  product<true, false>};
    static const ProductKernel kp = {"amx",        k_min_batch,           available, panel_supports,     packed_bytes,
                                     pack_scratch, product_scratch<true>, pack,      product<true, true>};
    return panels ? kp : k;
}

bool panels_available(const ggml_tensor * w) {
    return block::rows_available() && block::panels_fit(w);
}

void panel_rows(const ggml_tensor * w, const int32_t * ids, int64_t n, float * out, int64_t out_stride) {
    if (w->type != GGML_TYPE_Q8_0) throw Error("internal", std::string("[products] panels: no rows of ") + w->name);
    for (int64_t i = 0; i < n; ++i)
        block::q8_0_panel_row(static_cast<const uint8_t *>(w->data), w->nb[1], w->ne[0], ids[i], out + i * out_stride);
}

void pack_panels(ggml_tensor * w) {
    if (!panels_available(w)) throw Error("internal", std::string("[products] panels: cannot pack ") + w->name);
    block::pack_panels_in_place(w);
}

}  // namespace kvlab::kernels
