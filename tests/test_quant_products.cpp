// kvlab's quantized products against ggml's own mul_mat on the CPU backend: the same bits for
// every output (the independent reference is ggml itself). The blocked Q4_1 product at batch sizes
// with and without padding, weight-row counts with partial tiles; the single-row Q8_0 / Q5_0
// product at row counts with and without a partial group of 8; 1 to 3 threads.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml-cpu.h"
#include "kernels/products.h"

namespace kvlab {
namespace {

struct Case {
    int64_t K, N, M;
};

// w x computed by ggml_mul_mat (kvlab false) or by kvlab's kernel under ggml's arithmetic (kernel k),
// with nth threads.
std::vector<float> run(ggml_type type, const Case & c, const std::vector<uint8_t> & wq, const std::vector<float> & x,
                       const kernels::ProductKernel * k, int nth) {
    ggml_init_params ip = {64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * w = ggml_new_tensor_2d(ctx.get(), type, c.K, c.N);
    ggml_tensor * xt = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, c.K, c.M);
    ggml_backend_ptr be(ggml_backend_cpu_init());
    ggml_backend_cpu_set_n_threads(be.get(), nth);
    ggml_backend_buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), be.get()));
    ggml_backend_tensor_set(w, wq.data(), 0, wq.size());
    ggml_backend_tensor_set(xt, x.data(), 0, x.size() * sizeof(float));
    ggml_context_ptr gctx(ggml_init({256 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true}));
    if (k) EXPECT_EQ(kernels::product_kernel(Products::ggml, w, xt), k);
    kernels::GraphScratch scratch(gctx.get(), nth);
    ggml_tensor * y =
        k ? kernels::mul_mat(gctx.get(), Products::ggml, scratch, w, xt) : ggml_mul_mat(gctx.get(), w, xt);
    ggml_cgraph * gf = ggml_new_graph(gctx.get());
    ggml_build_forward_expand(gf, y);
    scratch.finish();
    ggml_gallocr_ptr galloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(be.get())));
    EXPECT_TRUE(ggml_gallocr_alloc_graph(galloc.get(), gf));
    EXPECT_EQ(ggml_backend_graph_compute(be.get(), gf), GGML_STATUS_SUCCESS);
    std::vector<float> out(size_t(c.N * c.M));
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    return out;
}

// Every output of kvlab's product has ggml's bits, at 1 to 3 threads (random weights, activations
// with some outliers).
void expect_identical(ggml_type type, const std::vector<Case> & cases, const kernels::ProductKernel & kvlab) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const Case & c : cases) {
        std::vector<float> wf(size_t(c.K * c.N)), x(size_t(c.K * c.M));
        for (float & v : wf) v = nd(rng) * 0.05f;
        for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * (i % 97 == 0 ? 8.0f : 1.0f);  // some outliers
        std::vector<uint8_t> wq(ggml_row_size(type, c.K) * c.N);
        ggml_quantize_chunk(type, wf.data(), wq.data(), 0, c.N, c.K, nullptr);
        const std::vector<float> ref = run(type, c, wq, x, nullptr, 2);
        for (int nth : {1, 2, 3}) {
            const std::vector<float> got = run(type, c, wq, x, &kvlab, nth);
            ASSERT_EQ(got.size(), ref.size());
            size_t differ = 0;
            for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
            EXPECT_EQ(differ, 0u) << ggml_type_name(type) << " K " << c.K << " N " << c.N << " M " << c.M << " threads "
                                  << nth << ": outputs whose bits differ from ggml's";
        }
    }
}

TEST(GemmQ4_1, BitIdenticalToGgmlMulMat) {
    if (!kernels::q4_1_kernel().available())
        GTEST_SKIP() << "kvlab's Q4_1 kernel needs AVX-512 with VNNI; ggml_mul_mat runs instead";
    expect_identical(GGML_TYPE_Q4_1,
                     {Case{32, 4, 8}, Case{64, 6, 9}, Case{576, 192, 17}, Case{576, 13, 64}, Case{1536, 576, 515},
                      Case{576, 192, 1}, Case{64, 13, 1}, Case{1536, 576, 3}, Case{32, 5, 7}},
                     kernels::q4_1_kernel());
}

TEST(GemmQ8_0, Q8_0AndQ5_0BitIdenticalToGgmlMulMat) {
    if (!kernels::q8_0_kernel().available())
        GTEST_SKIP() << "kvlab's Q8_0 kernel needs AVX-512 with VNNI; ggml_mul_mat runs instead";
    const std::vector<Case> cases = {Case{32, 8, 1},     Case{64, 13, 1},   Case{576, 192, 1},  Case{896, 128, 1},
                                     Case{576, 4099, 1}, Case{4864, 21, 1}, Case{32, 5, 1},     Case{896, 130, 3},
                                     Case{64, 9, 7},     Case{896, 128, 8}, Case{896, 131, 17}, Case{4864, 22, 64},
                                     Case{896, 896, 515}};
    expect_identical(GGML_TYPE_Q8_0, cases, kernels::q8_0_kernel());
    expect_identical(GGML_TYPE_Q5_0, cases, kernels::q8_0_kernel());
}

TEST(GemmQ4_1, OtherTypesStayWithGgml) {
    ggml_init_params ip = {8 * ggml_tensor_overhead(), nullptr, true};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 8);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, 64);
    EXPECT_FALSE(kernels::q4_1_kernel().supports(GGML_TYPE_Q8_0));
    EXPECT_EQ(kernels::product_kernel(Products::ggml, w, x), nullptr);  // no buffer
    ggml_tensor * w4 = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q4_0, 64, 8);
    for (const auto * k : {&kernels::q4_1_kernel(), &kernels::q8_0_kernel(), &kernels::amx_kernel()})
        EXPECT_FALSE(k->supports(GGML_TYPE_Q4_0)) << k->name;
}

}  // namespace
}  // namespace kvlab
