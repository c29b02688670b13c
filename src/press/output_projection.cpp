// W_o read back as floats, and the Gram matrix of each query head's block of it.
#include <cstring>

#include "ggml.h"
#include "kvlab/error.h"
#include "press/eigen.h"
#include "press/method.h"

namespace kvlab::press {

std::vector<float> output_matrix(const Model & m, int il) {
    const ggml_tensor * wo = m.attn_output(il);
    const int64_t n_in = wo->ne[0], n_out = wo->ne[1];
    std::vector<float> w(size_t(n_in * n_out));
    const std::vector<uint8_t> raw = m.file_data(wo);  // the loaded copy may be repacked or in panels
    if (wo->type == GGML_TYPE_F32) {
        std::memcpy(w.data(), raw.data(), w.size() * sizeof(float));
    } else {
        const auto * tr = ggml_get_type_traits(wo->type);
        if (!tr->to_float)
            throw Error("press",
                        std::string("cannot dequantize the output matrix of type ") + ggml_type_name(wo->type));
        for (int64_t r = 0; r < n_out; ++r) tr->to_float(raw.data() + r * wo->nb[1], w.data() + r * n_in, n_in);
    }
    return w;
}

std::vector<float> output_grams(const Model & m, int il) {
    const HParams & hp = m.hparams();
    const int d = hp.head_dim;
    const int64_t n_in = int64_t(hp.n_head) * d;
    const std::vector<float> w = output_matrix(m, il);  // [n_embd][n_in]
    using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Map<const RowMajor> W(w.data(), hp.n_embd, n_in);
    std::vector<float> g(size_t(hp.n_head) * d * d);
    for (int h = 0; h < hp.n_head; ++h) {
        const Eigen::MatrixXd Wh = W.middleCols(int64_t(h) * d, d).cast<double>();
        Eigen::Map<RowMajor>(g.data() + size_t(h) * d * d, d, d) = (Wh.transpose() * Wh).cast<float>();
    }
    return g;
}

}  // namespace kvlab::press
