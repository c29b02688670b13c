// Built with -ffast-math (CMakeLists.txt) so that the dot products and exp loops
// vectorise; nothing here relies on infinities or NaNs.
#include "press/scoring.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvlab/error.h"

namespace kvlab::press {

namespace {

float dot(const float * a, const float * b, int d) {
    float s = 0.0f;
    for (int i = 0; i < d; ++i) s += a[i] * b[i];
    return s;
}

// In place: x[0..n) <- softmax(x); returns nothing. n >= 1.
void softmax(float * x, int64_t n) {
    float m = x[0];
    for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
        x[j] = std::exp(x[j] - m);
        sum += x[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

}  // namespace

std::vector<float> window_attention(const float * q, int64_t q_stride, const float * k, int64_t L, int w, int group,
                                    int d) {
    KVLAB_ASSERT(w >= 1 && w <= L, "window within the prompt");
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> out(size_t(L - w), 0.0f), p(static_cast<size_t>(L));
    for (int g = 0; g < group; ++g)
        for (int r = 0; r < w; ++r) {
            const float * qr = q + r * q_stride + g * d;
            const int64_t n = L - w + r + 1;  // keys before the window, then the window causally
            for (int64_t j = 0; j < n; ++j) p[j] = dot(qr, k + j * d, d) * scale;
            softmax(p.data(), n);
            for (int64_t j = 0; j < L - w; ++j) out[j] += p[j];
        }
    const float inv = 1.0f / float(group);
    for (float & x : out) x *= inv;
    return out;
}

std::vector<float> pool1d(const std::vector<float> & x, int kernel, Pool pool) {
    if (pool == Pool::none || kernel <= 1 || x.empty()) return x;
    KVLAB_ASSERT(kernel % 2 == 1, "pooling kernel is odd");
    const int64_t n = int64_t(x.size()), h = kernel / 2;
    std::vector<float> y(x.size());
    for (int64_t j = 0; j < n; ++j) {
        const int64_t a = std::max<int64_t>(0, j - h), b = std::min<int64_t>(n - 1, j + h);
        if (pool == Pool::max) {
            float m = x[a];
            for (int64_t i = a + 1; i <= b; ++i) m = std::max(m, x[i]);
            y[j] = m;
        } else {
            float s = 0.0f;
            for (int64_t i = a; i <= b; ++i) s += x[i];
            y[j] = s / float(kernel);
        }
    }
    return y;
}

void accumulate_column_sums(const float * q, int64_t q_stride, int64_t n, int64_t p0, const float * k, int group, int d,
                            float * col) {
    const float scale = 1.0f / std::sqrt(float(d));
    const float inv = 1.0f / float(group);
    std::vector<float> p(size_t(p0 + n));
    for (int64_t r = 0; r < n; ++r)
        for (int g = 0; g < group; ++g) {
            const float * qr = q + r * q_stride + g * d;
            const int64_t nk = p0 + r + 1;
            for (int64_t j = 0; j < nk; ++j) p[j] = dot(qr, k + j * d, d) * scale;
            softmax(p.data(), nk);
            for (int64_t j = 0; j < nk; ++j) col[j] += p[j] * inv;
        }
}

std::vector<float> last_query_attention(const float * q, const float * k, int64_t L, int d) {
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> p(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) p[j] = dot(q, k + j * d, d) * scale;
    softmax(p.data(), L);
    return p;
}

std::vector<float> negative_key_norms(const float * k, int64_t L, int d) {
    std::vector<float> s(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) s[j] = -std::sqrt(dot(k + j * d, k + j * d, d));
    return s;
}

std::vector<float> keydiff(const float * k, int64_t L, int d) {
    std::vector<float> m(size_t(d), 0.0f), norm(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) {
        norm[j] = std::max(std::sqrt(dot(k + j * d, k + j * d, d)), 1e-12f);
        for (int i = 0; i < d; ++i) m[i] += k[j * d + i] / norm[j];
    }
    for (float & x : m) x /= float(L);
    const float mn = std::max(std::sqrt(dot(m.data(), m.data(), d)), 1e-12f);
    std::vector<float> s(static_cast<size_t>(L));
    for (int64_t j = 0; j < L; ++j) s[j] = -dot(k + j * d, m.data(), d) / (norm[j] * mn);
    return s;
}

std::vector<float> expected_attention(const float * mu, const float * sigma, const float * k, const float * v,
                                      int64_t L, int group, int d, bool use_covariance, bool use_vnorm) {
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<float> out(size_t(L), 0.0f), p(static_cast<size_t>(L)), sk(static_cast<size_t>(d));
    for (int g = 0; g < group; ++g) {
        const float * m = mu + g * d;
        const float * sg = sigma + size_t(g) * d * d;
        for (int64_t j = 0; j < L; ++j) {
            const float * kj = k + j * d;
            float x = dot(m, kj, d) * scale;
            if (use_covariance) {
                for (int a = 0; a < d; ++a) sk[a] = dot(sg + a * d, kj, d);
                x += dot(kj, sk.data(), d) / (2.0f * float(d));
            }
            p[j] = x;
        }
        softmax(p.data(), L);
        for (int64_t j = 0; j < L; ++j) out[j] += p[j] / float(group);
    }
    if (use_vnorm)
        for (int64_t j = 0; j < L; ++j) out[j] *= std::sqrt(dot(v + j * d, v + j * d, d));
    return out;
}

std::vector<int32_t> top_rows(const float * scores, int64_t n_rows, int64_t n) {
    n = std::clamp<int64_t>(n, 0, n_rows);
    std::vector<int32_t> idx(static_cast<size_t>(n_rows));
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
    std::nth_element(idx.begin(), idx.begin() + n, idx.end(), better);
    idx.resize(static_cast<size_t>(n));
    std::sort(idx.begin(), idx.end());
    return idx;
}

}  // namespace kvlab::press
