#include "press/window_attention.h"

#include <algorithm>
#include <cmath>

#include "kvlab/error.h"
#include "press/eigen.h"
#include "press/method.h"

namespace kvlab::press {

std::vector<float> window_attention_weights(const HParams & hp, int il, const float * q, int64_t w, const float * k,
                                            const int32_t * pos, int64_t L, int n_threads) {
    KVLAB_ASSERT(w >= 1 && w <= L, "the window lies within the context");
    using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const int d = hp.head_dim, group = hp.n_gqa();
    const int64_t window = hp.window(il);
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<float> out(size_t(hp.n_head) * size_t(w) * size_t(L), 0.0f);
    parallel_for(hp.n_head, n_threads, [&](int64_t g) {
        const int h = int(g) / group;  // the KV head query head g reads
        const RowMajorD K = Eigen::Map<const RowMajorF>(k + size_t(h) * L * d, L, d).cast<double>();
        // the window's queries of head g: row r at q[r][g][:]
        const Eigen::Map<const RowMajorF, 0, Eigen::OuterStride<>> Qf(q + size_t(g) * d, w, d,
                                                                      Eigen::OuterStride<>(int64_t(hp.n_head) * d));
        const RowMajorD logits = (Qf.cast<double>() * K.transpose()) * scale;  // [w][L]
        std::vector<double> e(static_cast<size_t>(L));
        for (int64_t r = 0; r < w; ++r) {
            const int64_t p = pos[L - w + r];
            const auto sees = [&](int64_t j) { return pos[j] <= p && (window == 0 || p - pos[j] < window); };
            double mx = logits(r, L - w + r);  // its own row: always seen
            for (int64_t j = 0; j < L; ++j)
                if (sees(j)) mx = std::max(mx, logits(r, j));
            double sum = 0.0;
            for (int64_t j = 0; j < L; ++j) {
                e[size_t(j)] = sees(j) ? std::exp(logits(r, j) - mx) : 0.0;
                sum += e[size_t(j)];
            }
            float * o = out.data() + (size_t(g) * w + size_t(r)) * L;
            for (int64_t j = 0; j < L; ++j) o[j] = float(e[size_t(j)] / sum);
        }
    });
    return out;
}

}  // namespace kvlab::press
