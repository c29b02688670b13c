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
#include "model/gemm_q4_1.h"
#include "model/gemm_q8_0.h"

namespace kvlab {
namespace {

struct Case {
    int64_t K, N, M;
};

using Builder = ggml_tensor * (*)(ggml_context *, ggml_tensor *, ggml_tensor *);

// w x computed by ggml_mul_mat (kvlab = nullptr) or by kvlab's custom ops, with nth threads.
std::vector<float> run(ggml_type type, const Case & c, const std::vector<uint8_t> & wq, const std::vector<float> & x,
                       Builder kvlab, int nth) {
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
    EXPECT_TRUE(type == GGML_TYPE_Q4_1 ? gemm::applies(w, xt) : gemm_q8_0::applies(w, xt));
    ggml_tensor * y = kvlab ? kvlab(gctx.get(), w, xt) : ggml_mul_mat(gctx.get(), w, xt);
    ggml_cgraph * gf = ggml_new_graph(gctx.get());
    ggml_build_forward_expand(gf, y);
    ggml_gallocr_ptr galloc(ggml_gallocr_new(ggml_backend_get_default_buffer_type(be.get())));
    EXPECT_TRUE(ggml_gallocr_alloc_graph(galloc.get(), gf));
    EXPECT_EQ(ggml_backend_graph_compute(be.get(), gf), GGML_STATUS_SUCCESS);
    std::vector<float> out(size_t(c.N * c.M));
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    return out;
}

// Every output of kvlab's product has ggml's bits, at 1 to 3 threads (random weights, activations
// with some outliers).
void expect_identical(ggml_type type, const std::vector<Case> & cases, Builder kvlab) {
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
            const std::vector<float> got = run(type, c, wq, x, kvlab, nth);
            ASSERT_EQ(got.size(), ref.size());
            size_t differ = 0;
            for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
            EXPECT_EQ(differ, 0u) << ggml_type_name(type) << " K " << c.K << " N " << c.N << " M " << c.M << " threads "
                                  << nth << ": outputs whose bits differ from ggml's";
        }
    }
}

TEST(GemmQ4_1, BitIdenticalToGgmlMulMat) {
    if (!gemm::available()) GTEST_SKIP() << "kvlab's Q4_1 kernel needs AVX-512 with VNNI; ggml_mul_mat runs instead";
    expect_identical(GGML_TYPE_Q4_1,
                     {Case{32, 4, 8}, Case{64, 6, 9}, Case{576, 192, 17}, Case{576, 13, 64}, Case{1536, 576, 515},
                      Case{576, 192, 1}, Case{64, 13, 1}, Case{1536, 576, 3}, Case{32, 5, 7}},
                     gemm::mul_mat_q4_1);
}

TEST(GemmQ8_0, Q8_0AndQ5_0BitIdenticalToGgmlMulMat) {
    if (!gemm_q8_0::available())
        GTEST_SKIP() << "kvlab's Q8_0 kernel needs AVX-512 with VNNI; ggml_mul_mat runs instead";
    const std::vector<Case> cases = {Case{32, 8, 1},     Case{64, 13, 1},   Case{576, 192, 1},  Case{896, 128, 1},
                                     Case{576, 4099, 1}, Case{4864, 21, 1}, Case{32, 5, 1},     Case{896, 130, 3},
                                     Case{64, 9, 7},     Case{896, 128, 8}, Case{896, 131, 17}, Case{4864, 22, 64},
                                     Case{896, 896, 515}};
    expect_identical(GGML_TYPE_Q8_0, cases, gemm_q8_0::mul_mat);
    expect_identical(GGML_TYPE_Q5_0, cases, gemm_q8_0::mul_mat);
}

TEST(GemmQ4_1, OtherTypesStayWithGgml) {
    ggml_init_params ip = {8 * ggml_tensor_overhead(), nullptr, true};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * w = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q8_0, 64, 8);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, 64, 64);
    EXPECT_FALSE(gemm::applies(w, x));  // not Q4_1 (and no buffer)
    ggml_tensor * w4 = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_Q4_0, 64, 8);
    EXPECT_FALSE(gemm_q8_0::applies(w4, x));  // neither Q8_0 nor Q5_0
}

}  // namespace
}  // namespace kvlab
