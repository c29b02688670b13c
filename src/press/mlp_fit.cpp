// KVzap's MLP surrogate, trained: forward, backward and AdamW per layer (press/mlp_fit.h). The
// products are Eigen's over row-major float buffers; the samples' hidden states stay in bf16
// and a batch is widened to float when it is drawn.
#include "press/mlp_fit.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numbers>
#include <numeric>
#include <thread>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/eigen.h"

namespace kvlab {

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMajor>;
using Map = Eigen::Map<RowMajor>;

constexpr float k_inv_sqrt2 = float(1.0 / std::numbers::sqrt2);
constexpr float k_inv_sqrt_2pi = float(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);

Eigen::Map<const Eigen::RowVectorXf> row(const std::vector<float> & v) {
    return {v.data(), Eigen::Index(v.size())};
}

// out[j] = sum over the rows of m(i, j), row after row. Not Eigen's colwise().sum(): its
// vectorised partial reduction splits the work by the buffers' addresses, which changed the
// order (and the bits) of some sums from one allocation to the next.
void column_sums(const RowMajor & m, std::vector<float> & out) {
    std::fill(out.begin(), out.end(), 0.0f);
    for (Eigen::Index i = 0; i < m.rows(); ++i)
        for (Eigen::Index j = 0; j < m.cols(); ++j) out[size_t(j)] += m(i, j);
}

// splitmix64 of (seed, k): independent streams for the split and each layer from one seed.
uint64_t mix(uint64_t seed, uint64_t k) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (k + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Fisher-Yates with the raw generator (std::shuffle's draws are the library's choice).
void shuffle(std::vector<int64_t> & v, std::mt19937_64 & rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[size_t(rng() % i)]);
}

// n values uniform in [-bound, bound): torch's nn.Linear initialisation with bound 1/sqrt(fan_in).
std::vector<float> uniform(size_t n, double bound, std::mt19937_64 & rng) {
    std::vector<float> v(n);
    for (float & x : v) x = float(bound * (2.0 * double(rng() >> 11) * 0x1.0p-53 - 1.0));
    return v;
}

struct Forward {
    RowMajor h;    // [b][n_hidden]: GELU(x W1^T + b1)
    RowMajor dh;   // [b][n_hidden]: GELU'(x W1^T + b1), for the backward pass
    RowMajor out;  // [b][n_out]
};

void forward(const Surrogate::Layer & p, int n_in, int n_hidden, int n_out, const float * x, int64_t b, Forward & f,
             bool backward) {
    f.h.noalias() = ConstMap(x, b, n_in) * ConstMap(p.w1.data(), n_hidden, n_in).transpose();
    f.h.rowwise() += row(p.b1);
    if (backward) f.dh.resize(b, n_hidden);
    float * h = f.h.data();
    float * dh = backward ? f.dh.data() : nullptr;
    for (int64_t i = 0; i < b * n_hidden; ++i) {
        // exact GELU, written as Surrogate::predict evaluates it; its derivative Phi(a) + a phi(a)
        const float a = h[i], e = std::erf(a * k_inv_sqrt2);
        h[i] = 0.5f * a * (1.0f + e);
        if (dh) dh[i] = 0.5f * (1.0f + e) + a * k_inv_sqrt_2pi * std::exp(-0.5f * a * a);
    }
    f.out.noalias() = f.h * ConstMap(p.w2.data(), n_out, n_hidden).transpose();
    f.out.rowwise() += row(p.b2);
}

// x [b][n_in] (widened from bf16) and y [b][n_out] of the samples rows[off, off + b).
void gather(const MlpSamples & s, const std::vector<int64_t> & rows, size_t off, int64_t b, int n_in, int n_out,
            std::vector<float> & x, std::vector<float> & y) {
    x.resize(size_t(b * n_in));
    y.resize(size_t(b * n_out));
    for (int64_t i = 0; i < b; ++i) {
        const int64_t r = rows[off + size_t(i)];
        std::transform(s.x.begin() + r * n_in, s.x.begin() + (r + 1) * n_in, x.begin() + i * n_in, from_bf16);
        std::copy_n(s.y.begin() + r * n_out, n_out, y.begin() + i * n_out);
    }
}

// Runs f(il) for il in [0, n) on `threads` threads, thread t taking layers t, t + threads, ...;
// rethrows the first failure.
void for_layers(int n, int threads, const std::function<void(int)> & f) {
    const int T = std::clamp(threads, 1, n);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(T));
    std::vector<std::thread> pool;
    for (int t = 0; t < T; ++t)
        // Eigen's own OpenMP parallelism is off (EIGEN_DONT_PARALLELIZE, CMakeLists.txt): each
        // product stays on its thread, with the same bits whatever `threads` is
        pool.emplace_back([&, t] {
            try {
                for (int il = t; il < n; il += T) f(il);
            } catch (...) {
                errors[size_t(t)] = std::current_exception();
            }
        });
    for (std::thread & th : pool) th.join();
    for (const std::exception_ptr & e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace

uint16_t to_bf16(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN: quiet, not rounded to inf
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

MlpTrainer::MlpTrainer(int n_in, int n_out, const MlpFitOptions & o, uint64_t seed)
    : n_in_(n_in), n_out_(n_out), n_hidden_(o.n_hidden), o_(o), rng_(seed) {
    const size_t i = size_t(n_in), h = size_t(n_hidden_), out = size_t(n_out);
    p_.w1 = uniform(h * i, 1.0 / std::sqrt(double(n_in)), rng_);
    p_.b1 = uniform(h, 1.0 / std::sqrt(double(n_in)), rng_);
    p_.w2 = uniform(out * h, 1.0 / std::sqrt(double(n_hidden_)), rng_);
    p_.b2 = uniform(out, 1.0 / std::sqrt(double(n_hidden_)), rng_);
    for (Surrogate::Layer * l : {&g_, &m_, &v_}) {
        l->w1.assign(h * i, 0.0f);
        l->b1.assign(h, 0.0f);
        l->w2.assign(out * h, 0.0f);
        l->b2.assign(out, 0.0f);
    }
}

double MlpTrainer::step(const float * x, const float * y, int64_t b, double lr) {
    Forward f;
    forward(p_, n_in_, n_hidden_, n_out_, x, b, f, true);
    // MSE over every (sample, output): d loss / d out = 2 (out - y) / (b n_out)
    RowMajor d = f.out - ConstMap(y, b, n_out_);
    double sse = 0.0;
    for (int64_t i = 0; i < d.size(); ++i) sse += double(d.data()[i]) * d.data()[i];
    d *= float(2.0 / double(b * n_out_));
    Map(g_.w2.data(), n_out_, n_hidden_).noalias() = d.transpose() * f.h;
    column_sums(d, g_.b2);
    const RowMajor da = (d * ConstMap(p_.w2.data(), n_out_, n_hidden_)).cwiseProduct(f.dh);
    Map(g_.w1.data(), n_hidden_, n_in_).noalias() = da.transpose() * ConstMap(x, b, n_in_);
    column_sums(da, g_.b1);

    // clip_grad_norm_: the gradient scaled by clip / (norm + 1e-6) when that is below 1
    double sq = 0.0;
    for (const auto * g : {&g_.w1, &g_.b1, &g_.w2, &g_.b2})
        for (float v : *g) sq += double(v) * v;
    const float coef = float(std::min(1.0, o_.clip / (std::sqrt(sq) + 1e-6)));
    // AdamW as torch's: decoupled decay, then the bias-corrected moments; the scalars in double,
    // rounded to float once (1 - beta2 rounded from float's 0.999 would be 1.3e-5 off)
    ++t_;
    const float decay = float(1.0 - lr * o_.weight_decay), b2 = float(o_.beta2), one_b1 = float(1.0 - o_.beta1),
                one_b2 = float(1.0 - o_.beta2), step_size = float(lr / (1.0 - std::pow(o_.beta1, double(t_)))),
                bc2_sqrt = float(std::sqrt(1.0 - std::pow(o_.beta2, double(t_)))), eps = float(o_.eps);
    const auto update = [&](std::vector<float> & p, const std::vector<float> & g, std::vector<float> & m,
                            std::vector<float> & v) {
        for (size_t k = 0; k < p.size(); ++k) {
            const float gk = g[k] * coef;
            p[k] *= decay;
            m[k] += one_b1 * (gk - m[k]);
            v[k] = b2 * v[k] + one_b2 * gk * gk;
            p[k] -= step_size * m[k] / (std::sqrt(v[k]) / bc2_sqrt + eps);
        }
    };
    update(p_.w1, g_.w1, m_.w1, v_.w1);
    update(p_.b1, g_.b1, m_.b1, v_.b1);
    update(p_.w2, g_.w2, m_.w2, v_.w2);
    update(p_.b2, g_.b2, m_.b2, v_.b2);
    return sse / double(b * n_out_);
}

double MlpTrainer::loss(const MlpSamples & s, const std::vector<int64_t> & rows) const {
    std::vector<float> x, y;
    Forward f;
    double sse = 0.0;
    for (size_t off = 0; off < rows.size(); off += size_t(o_.batch)) {
        const int64_t b = std::min<int64_t>(o_.batch, int64_t(rows.size() - off));
        gather(s, rows, off, b, n_in_, n_out_, x, y);
        forward(p_, n_in_, n_hidden_, n_out_, x.data(), b, f, false);
        for (int64_t i = 0; i < b * n_out_; ++i) sse += std::pow(double(f.out.data()[i]) - y[size_t(i)], 2);
    }
    return rows.empty() ? 0.0 : sse / double(int64_t(rows.size()) * n_out_);
}

double MlpTrainer::epoch(const MlpSamples & s, std::vector<int64_t> & rows, double lr) {
    shuffle(rows, rng_);
    std::vector<float> x, y;
    double sum = 0.0;
    for (size_t off = 0; off < rows.size(); off += size_t(o_.batch)) {
        const int64_t b = std::min<int64_t>(o_.batch, int64_t(rows.size() - off));
        gather(s, rows, off, b, n_in_, n_out_, x, y);
        sum += step(x.data(), y.data(), b, lr) * double(b);
    }
    return rows.empty() ? 0.0 : sum / double(rows.size());
}

MlpFit fit_mlp(const std::vector<MlpSamples> & data, int n_in, int n_out, const MlpFitOptions & o, uint64_t seed,
               int threads, const std::function<void(int, int, double, double, double)> & progress) {
    if (data.empty() || n_in < 1 || n_out < 1)
        throw Error("train-scorer", "the MLP has no layer or no input or output to train");
    if (o.n_hidden < 1 || o.epochs < 1 || o.batch < 1 || !(o.lr > 0) || !(o.valid >= 0 && o.valid < 1))
        throw Error("train-scorer", "the MLP needs hidden >= 1, epochs >= 1, batch >= 1, lr > 0 and 0 <= valid < 1");
    const int64_t m = int64_t(data[0].y.size()) / n_out;
    for (const MlpSamples & s : data)
        if (s.x.size() != size_t(m * n_in) || s.y.size() != size_t(m * n_out))
            throw Error("train-scorer", "the MLP's layers hold samples of different counts or shapes");
    // the validation split: the same rows in every layer (kvpress's ValidSplit: one split)
    std::vector<int64_t> order(static_cast<size_t>(m));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 split(mix(seed, 0));
    shuffle(order, split);
    MlpFit fit;
    fit.n_valid = std::llround(o.valid * double(m));
    fit.n_train = m - fit.n_valid;
    if (fit.n_train < 1) throw Error("train-scorer", "no sample left to train the MLP on");
    std::vector<int64_t> valid(order.begin(), order.begin() + fit.n_valid),
        train(order.begin() + fit.n_valid, order.end());
    std::sort(valid.begin(), valid.end());
    std::sort(train.begin(), train.end());

    const double t0 = now_seconds();
    const int n_layer = int(data.size());
    std::vector<MlpTrainer> trainers;
    for (int il = 0; il < n_layer; ++il) trainers.emplace_back(n_in, n_out, o, mix(seed, uint64_t(il) + 1));
    std::vector<std::vector<int64_t>> rows(size_t(n_layer), train);  // each layer's own order
    fit.train_loss.assign(size_t(n_layer), {});
    fit.valid_loss.assign(size_t(n_layer), {});
    for (int e = 0; e < o.epochs; ++e) {
        // CosineAnnealingLR(T_max = epochs, eta_min = 0), stepped once per epoch
        const double lr = o.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * e / o.epochs));
        for_layers(n_layer, threads, [&](int il) {
            const size_t l = size_t(il);
            fit.train_loss[l].push_back(trainers[l].epoch(data[l], rows[l], lr));
            if (fit.n_valid > 0) fit.valid_loss[l].push_back(trainers[l].loss(data[l], valid));
        });
        if (progress) {
            double tl = 0.0, vl = 0.0;
            for (int il = 0; il < n_layer; ++il) {
                tl += fit.train_loss[size_t(il)].back();
                vl += fit.n_valid > 0 ? fit.valid_loss[size_t(il)].back() : NAN;
            }
            progress(e + 1, o.epochs, tl / n_layer, vl / n_layer, now_seconds() - t0);
        }
    }
    for (const MlpTrainer & t : trainers) fit.layers.push_back(t.params());
    return fit;
}

}  // namespace kvlab
