// kvlab's own arithmetic for Q4_1, Q5_0, Q8_0, Q4_K and Q6_K products (kernels/product_amx.cpp and
// product_vnni.cpp): AMX tiles for batches, AVX-512 VNNI below; the K-quants from weights packed
// into panels. For each type against a plain reference in double over the same quantized values
// (the error within the bound of its float steps), against ggml's mul_mat (within the sum of both
// orders' bounds; for the K-quants, whose activations ggml quantizes otherwise (Q8_K), plus both
// activations' quantization errors), and against itself: every output has the same bits whatever
// the batch it is part of (tiles or single rows), the padding and the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
#include "kernels/products.h"
#include "kvlab/error.h"
#include "kvlab/kernels.h"

namespace kvlab {
namespace {

bool kquant(ggml_type type) {
    return type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q6_K;
}

struct Problem {
    ggml_type type;
    int64_t K, N, M;
    std::vector<uint8_t> w;       // [N][K] of type
    std::vector<float> x;         // [M][K]
    std::vector<uint8_t> panels;  // w packed into panels (K-quants: the only layout the kernels read)
    size_t row_bytes() const { return ggml_row_size(type, K); }
};

// w rewritten into panels by kernels::pack_panels, as a model's weight is.
std::vector<uint8_t> packed_panels(const Problem & p) {
    ggml_init_params ip = {p.w.size() + 2 * ggml_tensor_overhead() + 4096, nullptr, false};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * t = ggml_new_tensor_2d(ctx.get(), p.type, p.K, p.N);
    std::memcpy(t->data, p.w.data(), p.w.size());
    kernels::pack_panels(t);
    const uint8_t * d = static_cast<const uint8_t *>(t->data);
    return std::vector<uint8_t>(d, d + p.w.size());
}

Problem make(ggml_type type, int64_t K, int64_t N, int64_t M, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    Problem p{type, K, N, M, {}, {}};
    std::vector<float> wf(size_t(K * N));
    for (float & v : wf) v = nd(rng) * 0.05f + 0.01f;
    p.x.resize(size_t(K * M));
    for (size_t i = 0; i < p.x.size(); ++i) p.x[i] = nd(rng) * (i % 97 == 0 ? 8.0f : 1.0f);  // some outliers
    p.w.resize(p.row_bytes() * size_t(N));
    ggml_quantize_chunk(type, wf.data(), p.w.data(), 0, N, K, nullptr);
    if (kquant(type)) p.panels = packed_panels(p);
    return p;
}

// The kernel that reads p's weights: k itself, or for the K-quants the same kernel over panels.
const kernels::ProductKernel & for_type(const Problem & p, const kernels::ProductKernel & k) {
    if (!kquant(p.type)) return k;
    return &k == &kernels::amx_kernel() ? kernels::amx_kernel(true) : kernels::vnni_kernel(true);
}

// kvlab's product of rows [m0, m0 + M) of x by kernel k (amx_kernel or vnni_kernel; for the
// K-quants their panel kernels over p.panels), each thread's share computed in turn.
// w: the weights as k reads them (null: p.w, or p.panels).
std::vector<float> kvlab_product(const Problem & p, int64_t m0, int64_t M, int nth,
                                 const kernels::ProductKernel & k_ = kernels::vnni_kernel(),
                                 const uint8_t * w = nullptr) {
    const kernels::ProductKernel & k = for_type(p, k_);
    if (!w && kquant(p.type)) w = p.panels.data();
    std::vector<uint8_t> packed(k.packed_bytes(p.K, M));
    // the threads' scratch holds bytes of all ones first: what it held must not change a bit
    kernels::ScratchBuffer pack_scratch(k.pack_scratch(p.K, M).bytes(), nth, 0xff);
    for (int ith = 0; ith < nth; ++ith)
        k.pack(p.x.data() + m0 * p.K, p.K, M, p.K, packed.data(), ith, nth, pack_scratch.slice(ith));
    std::vector<float> out(size_t(p.N * M), NAN);
    kernels::ScratchBuffer scratch(k.product_scratch(p.K, M).bytes(), nth, 0xff);
    for (int ith = 0; ith < nth; ++ith)
        k.product(p.type, w ? w : p.w.data(), p.row_bytes(), p.K, p.N, packed.data(), M, out.data(), p.N, ith, nth,
                  scratch.slice(ith));
    return out;
}

float f16(const uint8_t * b) {
    ggml_fp16_t h;
    std::memcpy(&h, b, 2);
    return ggml_fp16_to_fp32(h);
}

// Block ib (32 values) of a weight row: its integer values, the scale of its first and second 16
// (equal but for Q6_K) and its minimum (Q4_1, Q4_K), by ggml's layouts (ggml-common.h): value j is
// d[j / 16] * v[j] + m, each scale and minimum an exact float.
struct WeightBlock {
    int32_t v[32];
    float d[2], m;
};

WeightBlock weight_block(ggml_type type, const uint8_t * row, int64_t ib) {
    WeightBlock w{};
    if (type == GGML_TYPE_Q4_K) {  // super-blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales, 128 nibbles
        const uint8_t * b = row + (ib / 8) * 144;
        const int j = int(ib % 8);
        const uint8_t * sc = b + 4;
        const int scale = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0x0F) | (sc[j - 4] >> 6) << 4;
        const int min = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
        w.d[0] = w.d[1] = f16(b) * float(scale);
        w.m = -(f16(b + 2) * float(min));
        for (int l = 0; l < 32; ++l) w.v[l] = (b[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        return w;
    }
    if (type == GGML_TYPE_Q6_K) {  // ql[128], qh[64], int8 scales[16] (one per 16 values), f16 d; value q - 32
        const uint8_t * b = row + (ib / 8) * 210;
        const int j = int(ib % 8), half = j / 4, k = j % 4;  // values 128 half + 32 k + l
        for (int l = 0; l < 32; ++l) {
            const int low = (b[64 * half + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0F;
            const int high = (b[128 + 32 * half + l] >> (2 * k)) & 3;
            w.v[l] = (low | high << 4) - 32;
        }
        w.d[0] = f16(b + 208) * float(int8_t(b[192 + 2 * j]));
        w.d[1] = f16(b + 208) * float(int8_t(b[192 + 2 * j + 1]));
        return w;
    }
    if (type == GGML_TYPE_Q4_1) {  // f16 d, f16 m, nibbles: value j low nibble of byte j, j + 16 high
        const uint8_t * b = row + ib * 20;
        w.d[0] = w.d[1] = f16(b), w.m = f16(b + 2);
        for (int j = 0; j < 16; ++j) w.v[j] = b[4 + j] & 0x0F, w.v[j + 16] = b[4 + j] >> 4;
    } else if (type == GGML_TYPE_Q5_0) {  // f16 d, 32 high bits, nibbles; value - 16
        const uint8_t * b = row + ib * 22;
        uint32_t h;
        std::memcpy(&h, b + 2, 4);
        w.d[0] = w.d[1] = f16(b);
        for (int j = 0; j < 16; ++j) {
            w.v[j] = int32_t((b[6 + j] & 0x0F) | ((h >> j) & 1) << 4) - 16;
            w.v[j + 16] = int32_t((b[6 + j] >> 4) | ((h >> (j + 16)) & 1) << 4) - 16;
        }
    } else {  // Q8_0: f16 d, 32 int8
        const uint8_t * b = row + ib * 34;
        w.d[0] = w.d[1] = f16(b);
        for (int j = 0; j < 32; ++j) w.v[j] = int8_t(b[2 + j]);
    }
    return w;
}

// The exact value of each output over the quantized weights and activations (kvlab's: Q8_1
// blocks where the type has minima, Q8_0 blocks else; ggml's vec_dot_type for the 32-value types),
// and sum |terms| (the products d_w d_y sum, per half for Q6_K, and for Q4_1 / Q4_K m_w s_y). A
// float evaluation in S rounded steps, each term rounded once before it is added, is off by at
// most (S + 2) u sum |terms|, u = 2^-24: kvlab's chain has S <= 2 nb; ggml's 8 lane chains of nb
// steps (lane l: values 4l..4l+3), its 3 additions across lanes, the minima's chain of nb steps and
// the final addition S <= 2 nb + 4. For the K-quants ggml quantizes the activations otherwise (Q8_K:
// 256 values, a float scale): act = sum |w_i| (|x_i - x_i kvlab| + |x_i - x_i ggml|) over the
// weights' dequantized values bounds what the two activations alone make differ, and ggml's float
// steps are bounded by (2 nb + 6) u sum |w_i| |x_i ggml|.
struct Reference {
    std::vector<double> value, mag, mag_lanes;  // mag_lanes: ggml's terms, per lane of 4 products
    std::vector<double> act;                    // K-quants: the activations' part (above)
    int64_t nb;
    double kvlab_bound(size_t i) const { return double(2 * nb + 2) * std::ldexp(1.0, -24) * mag[i]; }
    double ggml_bound(size_t i) const { return double(2 * nb + 6) * std::ldexp(1.0, -24) * mag_lanes[i]; }
};

ggml_type activation_type(ggml_type type) {
    return type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q4_K ? GGML_TYPE_Q8_1 : GGML_TYPE_Q8_0;
}

// |x_i - its quantized value| for a row of x, for kvlab's (Q8_0/Q8_1) or ggml's Q8_K blocks.
std::vector<double> activation_error(const float * x, int64_t K, ggml_type yt) {
    std::vector<uint8_t> y(size_t(K / ggml_blck_size(yt)) * ggml_type_size(yt));
    ggml_get_type_traits_cpu(yt)->from_float(x, y.data(), K);
    std::vector<double> err(static_cast<size_t>(K));
    for (int64_t i = 0; i < K; ++i) {
        double xq;
        if (yt == GGML_TYPE_Q8_K) {  // block_q8_K: float d, int8 qs[256], ...
            const uint8_t * b = y.data() + (i / 256) * ggml_type_size(yt);
            float d;
            std::memcpy(&d, b, 4);
            xq = double(d) * int8_t(b[4 + i % 256]);
        } else {
            const uint8_t * b = y.data() + (i / 32) * ggml_type_size(yt);
            xq = double(f16(b)) * int8_t(b[(yt == GGML_TYPE_Q8_1 ? 4 : 2) + i % 32]);
        }
        err[size_t(i)] = std::fabs(double(x[i]) - xq);
    }
    return err;
}

Reference reference(const Problem & p) {
    const int64_t nb = p.K / 32;
    const ggml_type yt = activation_type(p.type);
    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(yt)->from_float;
    const size_t y_block = ggml_type_size(yt), y_qs = yt == GGML_TYPE_Q8_1 ? 4 : 2;
    std::vector<uint8_t> y(size_t(nb) * y_block);
    std::vector<float> w_row(size_t(p.K));
    const size_t n_out = size_t(p.N * p.M);
    Reference r{std::vector<double>(n_out), std::vector<double>(n_out), std::vector<double>(n_out),
                std::vector<double>(n_out), nb};
    for (int64_t m = 0; m < p.M; ++m) {
        const float * x = p.x.data() + m * p.K;
        quantize(x, y.data(), p.K);
        std::vector<double> ek, eg;
        if (kquant(p.type)) ek = activation_error(x, p.K, yt), eg = activation_error(x, p.K, GGML_TYPE_Q8_K);
        for (int64_t n = 0; n < p.N; ++n) {
            const uint8_t * row = p.w.data() + size_t(n) * p.row_bytes();
            double v = 0.0, mag = 0.0, mag_lanes = 0.0;
            for (int64_t ib = 0; ib < nb; ++ib) {
                const WeightBlock wb = weight_block(p.type, row, ib);
                const uint8_t * yb = y.data() + ib * y_block;
                int32_t sum[2] = {0, 0}, lanes = 0;  // lanes: sum of |each 4 values' sum|
                for (int l = 0; l < 8; ++l) {
                    int32_t lane = 0;
                    for (int j = 4 * l; j < 4 * l + 4; ++j) lane += wb.v[j] * int8_t(yb[y_qs + j]);
                    sum[l / 4] += lane;
                    lanes += std::abs(lane);
                }
                const double dy = f16(yb), t2 = yt == GGML_TYPE_Q8_1 ? double(wb.m) * f16(yb + 2) : 0.0;
                const double t0 = double(wb.d[0]) * dy * sum[0], t1 = double(wb.d[1]) * dy * sum[1];
                v += t0 + t1 + t2;
                // kvlab takes one term per block (d_w d_y (sum0 + sum1)) but for Q6_K (two)
                mag += (p.type == GGML_TYPE_Q6_K ? std::fabs(t0) + std::fabs(t1) : std::fabs(t0 + t1)) + std::fabs(t2);
                mag_lanes += std::fabs(double(wb.d[0]) * dy) * lanes + std::fabs(t2);
            }
            const size_t o = size_t(m * p.N + n);
            r.value[o] = v;
            r.mag[o] = mag;
            r.mag_lanes[o] = mag_lanes;
            if (!kquant(p.type)) continue;
            ggml_get_type_traits(p.type)->to_float(row, w_row.data(), p.K);
            double act = 0.0, mag_g = 0.0;
            for (int64_t i = 0; i < p.K; ++i) {
                const double aw = std::fabs(double(w_row[size_t(i)]));
                act += aw * (ek[size_t(i)] + eg[size_t(i)]);
                mag_g += aw * (std::fabs(double(x[i])) + eg[size_t(i)]);
            }
            r.act[o] = act;
            r.mag_lanes[o] = mag_g;
        }
    }
    return r;
}

std::vector<float> ggml_product(const Problem & p) {
    ggml_context_ptr ctx(ggml_init({8 * ggml_tensor_overhead(), nullptr, true}));
    ggml_tensor * w = ggml_new_tensor_2d(ctx.get(), p.type, p.K, p.N);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, p.K, p.M);
    ggml_backend_ptr be(ggml_backend_cpu_init());
    ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), be.get()));
    ggml_backend_tensor_set(w, p.w.data(), 0, p.w.size());
    ggml_backend_tensor_set(x, p.x.data(), 0, p.x.size() * sizeof(float));
    ggml_context_ptr gctx(ggml_init({16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true}));
    ggml_tensor * y = ggml_mul_mat(gctx.get(), w, x);
    ggml_cgraph * gf = ggml_new_graph(gctx.get());
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_ptr galloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(be.get())));
    EXPECT_TRUE(ggml_gallocr_alloc_graph(galloc.get(), gf));
    EXPECT_EQ(ggml_backend_graph_compute(be.get(), gf), GGML_STATUS_SUCCESS);
    std::vector<float> out(size_t(p.N * p.M));
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    return out;
}

// vnni_kernel() runs wherever the CPU has VNNI and BITALG, AMD's Zen 4 and 5 included; so does
// amx_kernel() below 16 activation rows (the same code), its batches need the AMX tiles.
class GemmAmx : public ::testing::TestWithParam<ggml_type> {
protected:
    void SetUp() override {
        if (!kernels::amx_rows_available())
            GTEST_SKIP() << "no AVX-512 VNNI + BITALG on this CPU: kvlab's block order does not run here";
    }
    // The kernels this machine runs for a product of M rows.
    static std::vector<const kernels::ProductKernel *> kernels_for(int64_t M) {
        std::vector<const kernels::ProductKernel *> ks = {&kernels::vnni_kernel()};
        if (M < kernels::amx_kernel().min_batch || amx_available()) ks.push_back(&kernels::amx_kernel());
        return ks;
    }
};

// Shapes: a single block, partial weight panels, batches with and without padding, smollm2's,
// and single rows and small batches (VNNI). The K-quants: whole super-blocks (256 values) and
// whole panels (16 rows), one super-block, qwen2.5's ffn_down (4,864 x 896) in decode.
const std::vector<std::array<int64_t, 3>> k_shapes = {{32, 16, 16},     {64, 13, 17}, {576, 192, 37}, {576, 1536, 64},
                                                      {1536, 576, 100}, {96, 35, 1},  {576, 40, 5},   {576, 192, 15}};
const std::vector<std::array<int64_t, 3>> k_kquant_shapes = {{256, 16, 16},  {512, 48, 17},  {768, 192, 37},
                                                             {1536, 64, 64}, {256, 32, 100}, {4864, 896, 1},
                                                             {512, 32, 5},   {768, 48, 15}};

const std::vector<std::array<int64_t, 3>> & shapes(ggml_type type) {
    return kquant(type) ? k_kquant_shapes : k_shapes;
}

TEST_P(GemmAmx, WithinTheRoundingBoundOfTheExactValue) {
    double worst = 0.0;
    for (const auto & [K, N, M] : shapes(GetParam())) {
        const Problem p = make(GetParam(), K, N, M, unsigned(K + N + M));
        const Reference ref = reference(p);
        for (const kernels::ProductKernel * k : kernels_for(M)) {
            const std::vector<float> got = kvlab_product(p, 0, M, 2, *k);
            for (size_t i = 0; i < got.size(); ++i) {
                const double err = std::fabs(double(got[i]) - ref.value[i]);
                ASSERT_LE(err, ref.kvlab_bound(i))
                    << k->name << " K " << K << " N " << N << " M " << M << " output " << i;
                worst = std::max(worst, err / ref.kvlab_bound(i));
            }
        }
    }
    std::printf("[ measure  ] %s: largest error / bound: %.3g\n", ggml_type_name(GetParam()), worst);
}

TEST_P(GemmAmx, CloseToGgmlMulMat) {
    for (const auto & [K, N, M] : shapes(GetParam())) {
        const Problem p = make(GetParam(), K, N, M, unsigned(3 * K + N));
        const Reference ref = reference(p);
        const std::vector<float> g = ggml_product(p);
        for (const kernels::ProductKernel * k : kernels_for(M)) {
            const std::vector<float> got = kvlab_product(p, 0, M, 1, *k);
            size_t same = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                ASSERT_LE(std::fabs(double(got[i]) - g[i]), ref.kvlab_bound(i) + ref.ggml_bound(i) + ref.act[i])
                    << k->name << " K " << K << " N " << N << " M " << M;
                same += got[i] == g[i];
            }
            std::printf("[ measure  ] %s %s K %ld N %ld M %ld: %zu of %zu outputs equal to ggml's\n", k->name,
                        ggml_type_name(GetParam()), long(K), long(N), long(M), same, got.size());
        }
    }
}

// The same output bits from a 100-row batch by VNNI (8-row tiles and a 4-row tail), from its rows
// one at a time and in 5-row batches (the single-row path), from 16-row batches, at 1 to 3
// threads; and, where the CPU has AMX, from the tiles (the batch padded to 112).
TEST_P(GemmAmx, SameBitsWhateverTheBatch) {
    const Problem p = kquant(GetParam()) ? make(GetParam(), 768, 208, 100, 11) : make(GetParam(), 576, 200, 100, 11);
    const std::vector<float> whole = kvlab_product(p, 0, p.M, 1);
    const auto expect_rows = [&](const std::vector<float> & part, int64_t m0, int64_t M, const char * what) {
        EXPECT_EQ(std::memcmp(part.data(), whole.data() + m0 * p.N, part.size() * sizeof(float)), 0)
            << what << " rows " << m0 << ".." << m0 + M;
    };
    for (int nth : {2, 3}) expect_rows(kvlab_product(p, 0, p.M, nth), 0, p.M, "threads");
    for (int64_t m = 0; m < p.M; m += 7) expect_rows(kvlab_product(p, m, 1, 2), m, 1, "single row");
    for (int64_t m = 0; m + 5 <= p.M; m += 5) expect_rows(kvlab_product(p, m, 5, 1), m, 5, "5-row batch");
    for (int64_t m = 0; m + 16 <= p.M; m += 16) expect_rows(kvlab_product(p, m, 16, 2), m, 16, "16-row batch");
    for (int64_t m = 0; m + 23 <= p.M; m += 23) expect_rows(kvlab_product(p, m, 23, 2), m, 23, "23-row batch");
    if (!amx_available()) return;
    const kernels::ProductKernel & amx = kernels::amx_kernel();
    for (int nth : {1, 3}) expect_rows(kvlab_product(p, 0, p.M, nth, amx), 0, p.M, "amx tiles");
    for (int64_t m = 0; m + 16 <= p.M; m += 16) expect_rows(kvlab_product(p, m, 16, 2, amx), m, 16, "amx 16 rows");
    for (int64_t m = 0; m < p.M; m += 7) expect_rows(kvlab_product(p, m, 1, 2, amx), m, 1, "amx single row");
}

// Weights packed into 16-row panels (the layout a model's projections take under amx / vnni):
// the same bytes rearranged, so the same output bits as from the GGUF layout, for decode rows,
// small batches and batches, at 1 and 3 threads; and the packed tensor keeps its size. The
// K-quants have no other layout here (the tests above ran them from panels): the GGUF-layout
// kernels refuse them, and a matrix without whole super-blocks or panels is not packed.
TEST_P(GemmAmx, PanelsGiveTheSameBits) {
    if (kquant(GetParam())) {
        EXPECT_FALSE(kernels::vnni_kernel().supports(GetParam()));
        EXPECT_FALSE(kernels::amx_kernel().supports(GetParam()));
        EXPECT_TRUE(kernels::vnni_kernel(true).supports(GetParam()));
        EXPECT_TRUE(kernels::amx_kernel(true).supports(GetParam()));
        ggml_context_ptr ctx(ggml_init({4 * ggml_tensor_overhead(), nullptr, true}));
        EXPECT_FALSE(kernels::panels_available(ggml_new_tensor_2d(ctx.get(), GetParam(), 256, 8)));
        EXPECT_FALSE(kernels::panels_available(ggml_new_tensor_2d(ctx.get(), GetParam(), 256, 24)));
        EXPECT_TRUE(kernels::panels_available(ggml_new_tensor_2d(ctx.get(), GetParam(), 512, 32)));
        return;
    }
    const Problem p = make(GetParam(), 576, 192, 100, 17);
    ggml_init_params ip = {p.w.size() + 2 * ggml_tensor_overhead() + 4096, nullptr, false};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * t = ggml_new_tensor_2d(ctx.get(), p.type, p.K, p.N);
    ASSERT_EQ(ggml_nbytes(t), p.w.size());
    std::memcpy(t->data, p.w.data(), p.w.size());
    ASSERT_TRUE(kernels::panels_available(t));
    kernels::pack_panels(t);
    const uint8_t * packed = static_cast<const uint8_t *>(t->data);
    EXPECT_NE(std::memcmp(packed, p.w.data(), p.w.size()), 0) << "the layout changed";
    for (const kernels::ProductKernel * k : kernels_for(p.M)) {
        const kernels::ProductKernel & kp =
            k == &kernels::vnni_kernel() ? kernels::vnni_kernel(true) : kernels::amx_kernel(true);
        for (const auto & [m0, M] :
             std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {7, 1}, {3, 5}, {10, 15}, {0, 100}, {20, 37}})
            for (int nth : {1, 3}) {
                const std::vector<float> a = kvlab_product(p, m0, M, nth, *k),
                                         b = kvlab_product(p, m0, M, nth, kp, packed);
                EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
                    << k->name << " rows " << m0 << ".." << m0 + M << " threads " << nth;
            }
    }
    if (p.type == GGML_TYPE_Q8_0) {  // a tied embedding table's rows: ggml's dequantized floats
        const std::vector<int32_t> ids = {0, 5, 15, 16, 100, 191};
        std::vector<float> got(ids.size() * size_t(p.K)), want(size_t(p.K));
        kernels::panel_rows(t, ids.data(), int64_t(ids.size()), got.data(), p.K);
        for (size_t i = 0; i < ids.size(); ++i) {
            ggml_get_type_traits(p.type)->to_float(p.w.data() + size_t(ids[i]) * p.row_bytes(), want.data(), p.K);
            EXPECT_EQ(std::memcmp(got.data() + i * size_t(p.K), want.data(), want.size() * sizeof(float)), 0)
                << "row " << ids[i];
        }
    } else {
        const int32_t id = 0;
        std::vector<float> row(size_t(p.K));
        EXPECT_THROW(kernels::panel_rows(t, &id, 1, row.data(), p.K), Error);
    }
    ggml_tensor * odd = ggml_new_tensor_2d(ctx.get(), p.type, 32, 8);  // no whole panel
    EXPECT_FALSE(kernels::panels_available(odd));
    EXPECT_THROW(kernels::pack_panels(odd), Error);
}

// The reference's reading of each type's blocks (weight_block) gives ggml's dequantized values
// (dequantize_row_*): d v + m within one rounding of each float step (ggml may fuse them).
TEST_P(GemmAmx, ReferenceReadsGgmlsValues) {
    const Problem p = make(GetParam(), 768, 16, 1, 23);
    std::vector<float> want(size_t(p.K));
    for (int64_t n = 0; n < p.N; ++n) {
        const uint8_t * row = p.w.data() + size_t(n) * p.row_bytes();
        ggml_get_type_traits(p.type)->to_float(row, want.data(), p.K);
        for (int64_t i = 0; i < p.K; ++i) {
            const WeightBlock wb = weight_block(p.type, row, i / 32);
            const double t = double(wb.d[i % 32 / 16]) * wb.v[i % 32];
            ASSERT_NEAR(t + wb.m, want[size_t(i)], std::ldexp(std::fabs(t) + std::fabs(wb.m), -23))
                << "row " << n << " value " << i;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    , GemmAmx, ::testing::Values(GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K),
    [](const ::testing::TestParamInfo<ggml_type> & i) { return std::string(ggml_type_name(i.param)); });

// The packed activations are ggml's Q8_1 blocks (quantize_row_q8_1) value for value: the int8
// values, the scale and the sum as their f16 bits converted, and the exact sums of the values (all 32, the first 16);
// the values and scale also those of ggml's Q8_0 blocks (quantize_row_q8_0, what Q5_0 and Q8_0
// weights meet); padded rows zero. With blocks of zeros, of halves that round to even, and outliers.
TEST(GemmAmxPack, HoldsGgmlsQ8_1AndQ8_0Blocks) {
    if (!kernels::amx_rows_available()) GTEST_SKIP() << "no AVX-512 VNNI + BITALG on this CPU";
    const int64_t K = 576, M = 37, nb = K / 32, Mp = 48;
    Problem p = make(GGML_TYPE_Q4_1, K, 16, M, 5);
    std::fill(p.x.begin() + 64, p.x.begin() + 96, 0.0f);  // row 0, block 2: zeros
    for (int j = 0; j < 32; ++j) p.x[size_t(K + j)] = (j - 16) * 0.5f + (j == 5 ? 63.5f : 0.0f);
    ASSERT_EQ(kernels::amx_kernel().packed_bytes(K, M), size_t(Mp * K + 4 * nb * Mp * 4));
    std::vector<uint8_t> packed(kernels::amx_kernel().packed_bytes(K, M), 0xAB);
    ASSERT_EQ(kernels::amx_kernel().pack_scratch(K, M).bytes(), 0u);  // the block order packs without scratch
    for (int ith = 0; ith < 2; ++ith) kernels::amx_kernel().pack(p.x.data(), K, M, K, packed.data(), ith, 2, {});
    const int8_t * qs = reinterpret_cast<const int8_t *>(packed.data());
    const float * d = reinterpret_cast<const float *>(packed.data() + Mp * K);
    const float * s = d + nb * Mp;
    const int32_t * q = reinterpret_cast<const int32_t *>(s + nb * Mp);
    const int32_t * h = q + nb * Mp;
    const ggml_from_float_t q8_1 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_1)->from_float;
    const ggml_from_float_t q8_0 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    std::vector<uint8_t> y(size_t(nb) * 36), y0(size_t(nb) * 34);
    for (int64_t m = 0; m < Mp; ++m) {
        if (m < M) q8_1(p.x.data() + m * K, y.data(), K), q8_0(p.x.data() + m * K, y0.data(), K);
        for (int64_t ib = 0; ib < nb; ++ib) {
            const uint8_t * b = y.data() + ib * 36;
            const uint8_t * b0 = y0.data() + ib * 34;
            int32_t sum = 0, first = 0;
            for (int j = 0; j < 32; ++j) {
                ASSERT_EQ(qs[m * K + ib * 32 + j], m < M ? int8_t(b[4 + j]) : 0) << "row " << m << " block " << ib;
                if (m < M) ASSERT_EQ(b0[2 + j], b[4 + j]) << "Q8_0 and Q8_1 values, row " << m << " block " << ib;
                sum += qs[m * K + ib * 32 + j];
                if (j == 15) first = sum;
            }
            ASSERT_EQ(d[ib * Mp + m], m < M ? f16(b) : 0.0f) << "row " << m << " block " << ib;
            if (m < M) ASSERT_EQ(f16(b0), f16(b)) << "Q8_0 and Q8_1 scales, row " << m << " block " << ib;
            ASSERT_EQ(s[ib * Mp + m], m < M ? f16(b + 2) : 0.0f) << "row " << m << " block " << ib;
            ASSERT_EQ(q[ib * Mp + m], sum) << "row " << m << " block " << ib;
            ASSERT_EQ(h[ib * Mp + m], first) << "row " << m << " block " << ib;
        }
    }
}

TEST(Products, ParsesAndRefusesWhatTheMachineLacks) {
    EXPECT_EQ(parse_products("ggml"), Products::ggml);
    EXPECT_EQ(parse_products("auto"),
              amx_available() ? Products::amx : (vnni_available() ? Products::vnni : Products::ggml));
    EXPECT_EQ(default_products(), parse_products("auto"));
    EXPECT_EQ(vnni_available(), kernels::amx_rows_available());
    if (amx_available())
        EXPECT_EQ(parse_products("amx"), Products::amx);
    else
        EXPECT_THROW(parse_products("amx"), Error);
    if (vnni_available())
        EXPECT_EQ(parse_products("vnni"), Products::vnni);
    else
        EXPECT_THROW(parse_products("vnni"), Error);
    EXPECT_THROW(parse_products("fast"), Error);
    EXPECT_STREQ(products_name(Products::ggml), "ggml");
    EXPECT_STREQ(products_name(Products::amx), "amx");
    EXPECT_STREQ(products_name(Products::vnni), "vnni");
}

}  // namespace
}  // namespace kvlab
