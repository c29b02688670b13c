// ExpectedAttention (docs/methods.md, kvpress): statistics of the context's pre-RoPE queries
// (mean and covariance per query head, the n_sink first tokens excluded) rotated by the
// RoPE matrix averaged over the next n_future positions, give the attention that future
// queries are expected to pay each key; times ||v||; the n_sink first tokens are kept.
// Pre-RoPE queries are recovered from the observed post-RoPE ones by the inverse rotation.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-backend.h"
#include "ggml.h"
#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

typedef double v8d __attribute__((vector_size(64)));  // 8 doubles: one AVX-512 register

// The rotation pairs (a, b) of RoPE and their inverse frequencies (angle = pos * inv_freq)
// of layer il (a sliding-window layer has its own base and no scaling).
struct Rope {
    std::vector<int> a, b;
    std::vector<double> inv_freq;
    Rope(const Model & m, int il) {
        const HParams & hp = m.hparams();
        const int half = hp.n_rot / 2;
        std::vector<float> ff(size_t(half), 1.0f);
        if (const ggml_tensor * t = m.rope_freq_factors())
            ggml_backend_tensor_get(const_cast<ggml_tensor *>(t), ff.data(), 0, ff.size() * sizeof(float));
        for (int i = 0; i < half; ++i) {
            const bool neox = hp.rope_mode == GGML_ROPE_TYPE_NEOX;
            a.push_back(neox ? i : 2 * i);
            b.push_back(neox ? i + half : 2 * i + 1);
            const double scale = hp.window(il) > 0 ? 1.0 : double(hp.rope_freq_scale);
            inv_freq.push_back(scale * std::pow(double(hp.rope_theta_of(il)), -2.0 * i / hp.n_rot) / ff[i]);
        }
    }
    // x <- R(c, s) x on every pair, with per-pair cos and sin.
    void apply(double * x, const std::vector<double> & c, const std::vector<double> & s, int stride = 1) const {
        for (size_t i = 0; i < a.size(); ++i) {
            const double xa = x[a[i] * stride], xb = x[b[i] * stride];
            x[a[i] * stride] = c[i] * xa - s[i] * xb;
            x[b[i] * stride] = s[i] * xa + c[i] * xb;
        }
    }
};

class ExpectedScorer : public Scorer {
public:
    ExpectedScorer(const Params & p, const Model & m) : hp_(m.hparams()), n_threads_(m.n_threads()) {
        for (int il = 0; il < hp_.n_layer; ++il) rope_.emplace_back(m, il);
        n_future_ = p.get_int("n_future");
        n_sink_ = p.get_int("n_sink");
        use_cov_ = p.get_bool("covariance");
        use_vnorm_ = p.get_bool("vnorm");
        if (n_future_ < 1) throw Error("press", "expected_attention: n_future must be at least 1");
        if (n_sink_ < 0) throw Error("press", "expected_attention: n_sink must be non-negative");
    }

    const QueryObserver * observer(KvStore & cache, int64_t L, double * observe_s) override {
        if (cache.next_pos() != 0)
            throw Error("press", "expected_attention: the context must be prefilled into an empty cache");
        L_ = L;
        const int d = hp_.head_dim;
        count_ = 0;
        sum_.assign(hp_.n_layer, std::vector<double>(size_t(hp_.n_head) * d, 0.0));
        sum2_.assign(hp_.n_layer, std::vector<double>(size_t(hp_.n_head) * d * d, 0.0));
        obs_.first = std::min(n_sink_, L - 1);
        trig_ = {-1, 0, &rope_.front().inv_freq};
        obs_.on_queries = [this, observe_s](int il, int64_t tok0, int64_t n, const float * q) {
            const double t0 = now_seconds();
            const int d = hp_.head_dim, H = hp_.n_head;
            const Rope & rope = rope_[size_t(il)];
            // the inverse rotation of each token (angle -pos * f), shared by the query heads and
            // by the chunk's layers of the same frequencies (computed by the first of them)
            const size_t half = rope.a.size();
            if (trig_.inv_freq != &rope.inv_freq && *trig_.inv_freq != rope.inv_freq) trig_.tok0 = -1;
            if (trig_.tok0 != tok0 || trig_.n != n) {
                cos_.resize(size_t(n) * half);
                sin_.resize(size_t(n) * half);
                for (int64_t r = 0; r < n; ++r)
                    for (size_t i = 0; i < half; ++i) {
                        const double pos = double(tok0 + r);
                        cos_[size_t(r) * half + i] = std::cos(pos * rope.inv_freq[i]);
                        sin_[size_t(r) * half + i] = -std::sin(pos * rope.inv_freq[i]);
                    }
                trig_ = {tok0, n, &rope.inv_freq};
            }
            parallel_for(H, n_threads_, [&](int64_t qh) {
                constexpr int64_t k_tokens = 8;  // tokens added per pass over the sums
                std::vector<double> xs(size_t(k_tokens) * d), c(half), s(half);
                double * sm = sum_[il].data() + qh * d;
                double * s2 = sum2_[il].data() + qh * d * d;
                for (int64_t r0 = 0; r0 < n; r0 += k_tokens) {
                    const int64_t nt = std::min(k_tokens, n - r0);
                    for (int64_t t = 0; t < nt; ++t) {
                        const int64_t r = r0 + t;
                        const float * qr = q + (r * H + qh) * d;
                        double * x = xs.data() + t * d;
                        for (int e = 0; e < d; ++e) x[e] = qr[e];
                        c.assign(cos_.begin() + r * int64_t(half), cos_.begin() + (r + 1) * int64_t(half));
                        s.assign(sin_.begin() + r * int64_t(half), sin_.begin() + (r + 1) * int64_t(half));
                        rope.apply(x, c, s);
                    }
                    // each sum takes the tokens in order, as one token at a time would; of the
                    // second moments the upper triangle (score() reads it mirrored), by whole
                    // vectors of 8 from the one that holds the diagonal
                    for (int e = 0; e < d; ++e) {
                        double a = sm[e];
                        for (int64_t t = 0; t < nt; ++t) a += xs[size_t(t * d + e)];
                        sm[e] = a;
                    }
                    if (d % 8 == 0) {
                        for (int e = 0; e < d; ++e)
                            for (int v = e / 8; v < d / 8; ++v) {  // one chain per vector, in a register
                                v8d a;
                                std::memcpy(&a, s2 + e * d + 8 * v, sizeof(v8d));
                                for (int64_t t = 0; t < nt; ++t) {
                                    v8d xf;
                                    std::memcpy(&xf, &xs[size_t(t * d + 8 * v)], sizeof(v8d));
                                    a += xs[size_t(t * d + e)] * xf;
                                }
                                std::memcpy(s2 + e * d + 8 * v, &a, sizeof(v8d));
                            }
                    } else {
                        for (int e = 0; e < d; ++e)
                            for (int f = e; f < d; ++f) {
                                double b = s2[e * d + f];
                                for (int64_t t = 0; t < nt; ++t) b += xs[size_t(t * d + e)] * xs[size_t(t * d + f)];
                                s2[e * d + f] = b;
                            }
                    }
                }
            });
            if (il == 0) count_ += n;
            *observe_s += now_seconds() - t0;
        };
        return &obs_;
    }

    Scores score(const KvStore & cache) override {
        const int64_t L = cache.n_rows(0, 0);
        if (sum_.empty() || L != L_ || count_ < 1)
            throw Error("press", "expected_attention: the context's queries were not observed during prefill");
        const int d = hp_.head_dim, group = hp_.n_gqa();
        // each layer's RoPE rotation averaged over the next n_future positions
        std::vector<std::vector<double>> cbars, sbars;
        for (const Rope & rope : rope_) {
            std::vector<double> cbar(rope.a.size(), 0.0), sbar(rope.a.size(), 0.0);
            for (size_t i = 0; i < cbar.size(); ++i) {
                for (int64_t t = 0; t < n_future_; ++t) {
                    cbar[i] += std::cos(double(L + t) * rope.inv_freq[i]);
                    sbar[i] += std::sin(double(L + t) * rope.inv_freq[i]);
                }
                cbar[i] /= double(n_future_);
                sbar[i] /= double(n_future_);
            }
            cbars.push_back(std::move(cbar));
            sbars.push_back(std::move(sbar));
        }
        Scores s;
        s.L = L;
        s.n_sink = std::min(n_sink_, L);
        s.s.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv));
        parallel_for(int64_t(hp_.n_layer) * hp_.n_head_kv, n_threads_, [&](int64_t u) {
            const int il = int(u / hp_.n_head_kv), h = int(u % hp_.n_head_kv);
            const Rope & rope = rope_[size_t(il)];
            const std::vector<double> &cbar = cbars[size_t(il)], &sbar = sbars[size_t(il)];
            std::vector<float> mu(size_t(group) * d), sigma(size_t(group) * d * d);
            std::vector<double> m(static_cast<size_t>(d)), cov(size_t(d) * d);
            for (int g = 0; g < group; ++g) {
                const int qh = h * group + g;
                const double * sm = sum_[il].data() + size_t(qh) * d;
                const double * s2 = sum2_[il].data() + size_t(qh) * d * d;
                for (int e = 0; e < d; ++e) m[e] = sm[e] / double(count_);
                for (int e = 0; e < d; ++e)  // s2 holds the upper triangle (f >= e)
                    for (int f = 0; f < d; ++f)
                        cov[e * d + f] = s2[std::min(e, f) * d + std::max(e, f)] / double(count_) - m[e] * m[f];
                rope.apply(m.data(), cbar, sbar);
                for (int f = 0; f < d; ++f) rope.apply(cov.data() + f, cbar, sbar, d);           // columns: R S
                for (int e = 0; e < d; ++e) rope.apply(cov.data() + size_t(e) * d, cbar, sbar);  // rows: (R S) R^T
                for (int e = 0; e < d; ++e) mu[size_t(g) * d + e] = float(m[e]);
                for (size_t e = 0; e < cov.size(); ++e) sigma[size_t(g) * d * d + e] = float(cov[e]);
            }
            const std::vector<float> k = keys(cache, il, h), v = values(cache, il, h);
            s.s[il][h] = kernels::expected_attention(mu.data(), sigma.data(), k.data(), v.data(), L, s.n_sink, group, d,
                                                     use_cov_, use_vnorm_);
        });
        return s;
    }

private:
    HParams hp_;
    int n_threads_;
    std::vector<Rope> rope_;  // [n_layer]
    int64_t n_future_ = 512, n_sink_ = 4, L_ = 0, count_ = 0;
    bool use_cov_ = true, use_vnorm_ = true;
    std::vector<std::vector<double>> sum_, sum2_;  // [layer][n_head][d], [layer][n_head][d][d] (upper triangle)
    std::vector<double> cos_, sin_;                // a chunk's inverse rotations: [token][pair]
    // the tokens and frequencies cos_ and sin_ hold
    struct {
        int64_t tok0, n;
        const std::vector<double> * inv_freq;
    } trig_{-1, 0, nullptr};
    QueryObserver obs_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model & m) {
    return std::make_unique<ExpectedScorer>(p, m);
}

const MethodRegistrar reg([] {
    return uniform_method(
        MethodInfo{"expected_attention",
                   "attention expected from future queries (query mean and covariance, RoPE-averaged), times ||v||",
                   {{"n_future", "512", "future positions the RoPE rotation is averaged over"},
                    {"n_sink", "4", "first tokens always kept and left out of the query statistics"},
                    {"covariance", "true", "include the k^T Sigma k / 2d term"},
                    {"vnorm", "true", "multiply by the value norm"}},
                   false,
                   true},
        make_scorer);
});

}  // namespace
}  // namespace kvlab::press
