// KVzap's MLP training (press/mlp_fit.h): two AdamW steps against a plain double evaluation of
// the forward pass, the backward pass, the clipping and AdamW, within a float error bound derived
// from the computation; the loss falls on a learnable target; the same bits at every thread
// count; bf16 rounding.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <random>
#include <utility>

#include "kvlab/error.h"
#include "press/mlp_fit.h"

namespace kvlab {
namespace {

constexpr double k_u = 0x1.0p-24;  // float's unit roundoff

double gamma(int n) {  // the bound of n float roundings in a row: n u / (1 - n u)
    return n * k_u / (1 - n * k_u);
}

std::vector<float> randn(size_t n, std::mt19937_64 & rng, float sd = 1.0f, float mean = 0.0f) {
    std::normal_distribution<float> d(mean, sd);
    std::vector<float> v(n);
    for (float & x : v) x = d(rng);
    return v;
}

// One layer's parameters in double, [w1, b1, w2, b2] flattened as Surrogate::Layer holds them.
using Params = std::array<std::vector<double>, 4>;

Params widen(const Surrogate::Layer & l) {
    Params p;
    const std::vector<float> * v[4] = {&l.w1, &l.b1, &l.w2, &l.b2};
    for (int k = 0; k < 4; ++k) p[k].assign(v[k]->begin(), v[k]->end());
    return p;
}

// The loss and the gradient of the batch in double, and for each gradient value a bound on the
// error of its float computation: each sum's bound is gamma(terms) times the sum of the terms'
// magnitudes (in any order, FMA or not), carried through the stages with GELU's slope (< 1.13)
// and curvature (< 0.8), and doubled for erf's and exp's own few ulps.
struct Reference {
    std::vector<double> out;  // [b][O]
    double loss = 0.0, loss_err = 0.0;
    Params grad, err;
};

Reference reference(const Params & p, const std::vector<float> & x, const std::vector<float> & y, int b, int n_in,
                    int H, int O) {
    const std::vector<double> &w1 = p[0], &b1 = p[1], &w2 = p[2], &b2 = p[3];
    std::vector<double> h(size_t(b) * H), dh(h.size()), eh(h.size()), edh(h.size());
    for (int i = 0; i < b; ++i)
        for (int j = 0; j < H; ++j) {
            double a = b1[j], mag = std::fabs(b1[j]);
            for (int k = 0; k < n_in; ++k) {
                a += w1[size_t(j) * n_in + k] * x[size_t(i) * n_in + k];
                mag += std::fabs(w1[size_t(j) * n_in + k] * x[size_t(i) * n_in + k]);
            }
            const double ea = gamma(n_in + 1) * mag, phi = 0.5 * (1.0 + std::erf(a / std::sqrt(2.0)));
            const size_t ij = size_t(i) * H + j;
            h[ij] = a * phi;
            dh[ij] = phi + a * std::exp(-0.5 * a * a) / std::sqrt(2.0 * M_PI);
            // erf's error is absolute (an ulp of 1 + erf): relative to h it grows where a << 0
            eh[ij] = 1.13 * ea + 8 * k_u * std::fabs(h[ij]) + 2 * k_u * std::fabs(a);
            edh[ij] = 0.8 * ea + 16 * k_u;
        }
    Reference r;
    for (int k = 0; k < 4; ++k) r.grad[k].assign(p[k].size(), 0.0), r.err[k].assign(p[k].size(), 0.0);
    std::vector<double> dout(size_t(b) * O), edout(dout.size());
    const double scale = 2.0 / (double(b) * O);
    for (int i = 0; i < b; ++i)
        for (int o = 0; o < O; ++o) {
            double v = b2[o], mag = std::fabs(b2[o]), prop = 0.0;
            for (int j = 0; j < H; ++j) {
                v += w2[size_t(o) * H + j] * h[size_t(i) * H + j];
                mag += std::fabs(w2[size_t(o) * H + j] * h[size_t(i) * H + j]);
                prop += std::fabs(w2[size_t(o) * H + j]) * eh[size_t(i) * H + j];
            }
            const double eout = prop + gamma(H + 1) * mag, res = v - y[size_t(i) * O + o];
            r.out.push_back(v);
            r.loss += res * res / (double(b) * O);
            r.loss_err += (2 * std::fabs(res) * eout + eout * eout + 4 * k_u * res * res) / (double(b) * O);
            dout[size_t(i) * O + o] = scale * res;
            edout[size_t(i) * O + o] = scale * (eout + k_u * std::fabs(res)) + 2 * k_u * scale * std::fabs(res);
        }
    r.loss_err += gamma(b * O) * r.loss;
    std::vector<double> &gw1 = r.grad[0], &gb1 = r.grad[1], &gw2 = r.grad[2], &gb2 = r.grad[3];
    std::vector<double> &ew1 = r.err[0], &eb1 = r.err[1], &ew2 = r.err[2], &eb2 = r.err[3];
    std::vector<double> mw1(gw1.size(), 0.0), mb1(gb1.size(), 0.0), mw2(gw2.size(), 0.0), mb2(gb2.size(), 0.0);
    for (int i = 0; i < b; ++i) {
        for (int o = 0; o < O; ++o) {
            const double d = dout[size_t(i) * O + o], ed = edout[size_t(i) * O + o];
            gb2[o] += d;
            mb2[o] += std::fabs(d);
            eb2[o] += ed;
            for (int j = 0; j < H; ++j) {
                const size_t ij = size_t(i) * H + j, oj = size_t(o) * H + j;
                gw2[oj] += d * h[ij];
                mw2[oj] += std::fabs(d * h[ij]);
                ew2[oj] += ed * std::fabs(h[ij]) + std::fabs(d) * eh[ij];
            }
        }
        for (int j = 0; j < H; ++j) {
            const size_t ij = size_t(i) * H + j;
            double dg = 0.0, mag = 0.0, prop = 0.0;
            for (int o = 0; o < O; ++o) {
                dg += dout[size_t(i) * O + o] * w2[size_t(o) * H + j];
                mag += std::fabs(dout[size_t(i) * O + o] * w2[size_t(o) * H + j]);
                prop += edout[size_t(i) * O + o] * std::fabs(w2[size_t(o) * H + j]);
            }
            const double edg = prop + gamma(O) * mag, da = dg * dh[ij];
            const double eda = edg * std::fabs(dh[ij]) + std::fabs(dg) * edh[ij] + k_u * std::fabs(da);
            gb1[j] += da;
            mb1[j] += std::fabs(da);
            eb1[j] += eda;
            for (int k = 0; k < n_in; ++k) {
                const double xk = x[size_t(i) * n_in + k];
                gw1[size_t(j) * n_in + k] += da * xk;
                mw1[size_t(j) * n_in + k] += std::fabs(da * xk);
                ew1[size_t(j) * n_in + k] += eda * std::fabs(xk);
            }
        }
    }
    const std::vector<double> * mags[4] = {&mw1, &mb1, &mw2, &mb2};
    for (int k = 0; k < 4; ++k)
        for (size_t e = 0; e < r.err[k].size(); ++e) r.err[k][e] = 2 * (r.err[k][e] + gamma(b) * (*mags[k])[e]);
    return r;
}

double norm(const Params & g) {
    double s = 0.0;
    for (const auto & v : g)
        for (double x : v) s += x * x;
    return std::sqrt(s);
}

// The clipping factor and a bound on its error, from the gradient's and its error bounds.
std::pair<double, double> clip_coef(const Params & g, const Params & err, double clip) {
    const double n = norm(g), en = norm(err);
    if (n + en + 1e-6 <= clip) return {1.0, 0.0};
    const double c = std::min(1.0, clip / (n + 1e-6));
    return {c, clip * en / std::pow(std::max(n - en, 0.0) + 1e-6, 2) + 2 * k_u * c};
}

void expect_gradient(const Surrogate::Layer & got, const Reference & r, const char * what) {
    const Params g = widen(got);
    const char * names[4] = {"w1", "b1", "w2", "b2"};
    for (int k = 0; k < 4; ++k)
        for (size_t e = 0; e < g[k].size(); ++e)
            ASSERT_NEAR(g[k][e], r.grad[k][e], r.err[k][e]) << what << " " << names[k] << "[" << e << "]";
}

TEST(MlpFit, TwoAdamWStepsMatchAPlainDoubleReference) {
    constexpr int n_in = 12, H = 16, O = 3, b = 40;
    MlpFitOptions o;
    o.n_hidden = H;
    const double lr = o.lr;
    for (const bool clipped : {true, false}) {
        SCOPED_TRACE(clipped ? "the gradient clipped" : "the gradient under the clip");
        std::mt19937_64 rng(clipped ? 3 : 4);
        const std::vector<float> x1 = randn(size_t(b) * n_in, rng, 1.5f), x2 = randn(size_t(b) * n_in, rng);
        MlpTrainer t(n_in, O, o, 77);
        const Params p0 = widen(t.params());
        // far targets make the gradient's norm above 1; targets near the outputs, below
        const auto targets = [&](const Params & p, const std::vector<float> & x, float mean) {
            std::vector<float> y = randn(size_t(b) * O, rng, 3.0f, mean);
            if (clipped) return y;
            const std::vector<double> out = reference(p, x, y, b, n_in, H, O).out;
            for (size_t e = 0; e < y.size(); ++e) y[e] = float(out[e] + 0.01 * y[e]);
            return y;
        };
        const std::vector<float> y1 = targets(p0, x1, 2.0f);
        const Reference r1 = reference(p0, x1, y1, b, n_in, H, O);
        const auto [c1, ec1] = clip_coef(r1.grad, r1.err, o.clip);
        ASSERT_EQ(c1 < 1.0, clipped) << "gradient norm " << norm(r1.grad);

        // step 1: the loss, the gradient, and the parameters after AdamW against the reference
        const double loss1 = t.step(x1.data(), y1.data(), b, lr);
        EXPECT_NEAR(loss1, r1.loss, r1.loss_err);
        expect_gradient(t.grad(), r1, "step 1 gradient");
        const Params p1 = widen(t.params());
        for (int k = 0; k < 4; ++k)
            for (size_t e = 0; e < p0[k].size(); ++e) {
                // at t = 1 AdamW moves by lr g / (|g| + eps): sensitive to g only near 0
                const double g = c1 * r1.grad[k][e], eg = c1 * r1.err[k][e] + ec1 * std::fabs(r1.grad[k][e]);
                const double want = p0[k][e] * (1 - lr * o.weight_decay) - lr * g / (std::fabs(g) + o.eps);
                const double slope = o.eps / std::pow(std::max(std::fabs(g) - eg, 0.0) + o.eps, 2);
                const double tol = lr * std::min(2.0, slope * eg) + 16 * k_u * lr + 8 * k_u * std::fabs(p0[k][e]);
                ASSERT_NEAR(p1[k][e], want, tol) << "step 1 parameter " << k << "[" << e << "]";
            }

        // step 2 from the float parameters: its gradient against the reference, then AdamW's moments
        // and bias corrections in double from the float gradients of both steps
        const Params g1 = widen(t.grad());
        const std::vector<float> y2 = targets(p1, x2, -1.0f);
        const Reference r2 = reference(p1, x2, y2, b, n_in, H, O);
        t.step(x2.data(), y2.data(), b, lr);
        expect_gradient(t.grad(), r2, "step 2 gradient");
        const Params g2 = widen(t.grad()), p2 = widen(t.params());
        const double n1 = std::min(1.0, o.clip / (norm(g1) + 1e-6)), n2 = std::min(1.0, o.clip / (norm(g2) + 1e-6));
        for (int k = 0; k < 4; ++k)
            for (size_t e = 0; e < p0[k].size(); ++e) {
                const double a = n1 * g1[k][e], bb = n2 * g2[k][e];
                const double m1 = (1 - o.beta1) * a, v1 = (1 - o.beta2) * a * a;
                const double m2 = o.beta1 * m1 + (1 - o.beta1) * bb, v2 = o.beta2 * v1 + (1 - o.beta2) * bb * bb;
                const double denom = std::sqrt(v2) / std::sqrt(1 - o.beta2 * o.beta2) + o.eps;
                const double step = lr / (1 - o.beta1 * o.beta1);
                const double want = p1[k][e] * (1 - lr * o.weight_decay) - step * m2 / denom;
                // float rounding: m2's sum (it may cancel), then a few roundings of the ratio and of p
                const double em2 = 4 * k_u * (std::fabs(o.beta1 * m1) + std::fabs((1 - o.beta1) * bb));
                const double tol =
                    step * (em2 / denom + 12 * k_u * std::fabs(m2) / denom) + 4 * k_u * std::fabs(p1[k][e]);
                ASSERT_NEAR(p2[k][e], want, tol) << "step 2 parameter " << k << "[" << e << "]";
            }
    }
}

// Two layers, each y = 2 tanh(x P) for its own random projection P: the MLP learns them, epoch
// after epoch, to a validation loss far below y's variance; the same bits on one thread or two.
TEST(MlpFit, LearnsATanhOfAProjectionTheSameAtEveryThreadCount) {
    constexpr int n_in = 16, O = 2, m = 4000;
    std::mt19937_64 rng(11);
    std::vector<MlpSamples> data(2);
    double var = 0.0;
    for (MlpSamples & d : data) {
        const std::vector<float> x = randn(size_t(m) * n_in, rng), P = randn(size_t(n_in) * O, rng, 0.35f);
        for (float v : x) d.x.push_back(to_bf16(v));
        for (int i = 0; i < m; ++i)
            for (int o = 0; o < O; ++o) {
                double z = 0.0;
                for (int k = 0; k < n_in; ++k) z += double(from_bf16(d.x[size_t(i) * n_in + k])) * P[size_t(k) * O + o];
                d.y.push_back(float(2.0 * std::tanh(z)));
            }
        double mean = 0.0;
        for (float v : d.y) mean += v / double(d.y.size());
        for (float v : d.y) var += (v - mean) * (v - mean) / double(d.y.size() * data.size());
    }
    MlpFitOptions o;
    o.n_hidden = 32;
    o.epochs = 30;
    o.batch = 64;
    int calls = 0;
    const MlpFit two = fit_mlp(data, n_in, O, o, 5, 2, [&](int epoch, int epochs, double train, double valid, double) {
        EXPECT_EQ(epoch, ++calls);
        EXPECT_EQ(epochs, o.epochs);
        EXPECT_TRUE(std::isfinite(train) && std::isfinite(valid));
    });
    EXPECT_EQ(calls, o.epochs);
    EXPECT_EQ(two.n_valid, 200) << "5% held out";
    EXPECT_EQ(two.n_train, m - 200);
    for (size_t l = 0; l < 2; ++l) {
        ASSERT_EQ(two.train_loss[l].size(), size_t(o.epochs));
        EXPECT_LT(two.train_loss[l].back(), 0.2 * two.train_loss[l].front()) << "layer " << l;
        EXPECT_LT(two.valid_loss[l].back(), 0.5 * two.valid_loss[l][2]) << "layer " << l << ": still improving";
        EXPECT_LT(two.valid_loss[l].back(), 0.01 * var) << "layer " << l << ": R^2 above 0.99";
    }
    const MlpFit one = fit_mlp(data, n_in, O, o, 5, 1);
    for (size_t l = 0; l < 2; ++l) {
        EXPECT_EQ(one.layers[l].w1, two.layers[l].w1) << "layer " << l;
        EXPECT_EQ(one.layers[l].b2, two.layers[l].b2) << "layer " << l;
        EXPECT_EQ(one.valid_loss[l], two.valid_loss[l]) << "layer " << l;
    }
    EXPECT_NE(fit_mlp(data, n_in, O, o, 6, 2).layers[0].w1, two.layers[0].w1) << "the seed matters";
    o.valid = 1.0;
    EXPECT_THROW(fit_mlp(data, n_in, O, o, 5, 2), Error);
    o.valid = 0.05;
    data[1].y.pop_back();
    EXPECT_THROW(fit_mlp(data, n_in, O, o, 5, 2), Error);
}

TEST(MlpFit, Bf16RoundsToNearestEven) {
    const auto bits = [](uint32_t u) { return to_bf16(std::bit_cast<float>(u)); };
    EXPECT_EQ(bits(0x3f800000u), 0x3f80u);  // 1
    EXPECT_EQ(bits(0x3f808000u), 0x3f80u);  // half-way, to the even below
    EXPECT_EQ(bits(0x3f818000u), 0x3f82u);  // half-way, to the even above
    EXPECT_EQ(bits(0x3f808001u), 0x3f81u);  // above half-way
    EXPECT_EQ(bits(0xbf807fffu), 0xbf80u);  // below half-way, negative
    EXPECT_EQ(bits(0x7f7fffffu), 0x7f80u);  // the largest float rounds to infinity
    EXPECT_TRUE(std::isnan(from_bf16(to_bf16(NAN))));
    EXPECT_TRUE(std::isnan(from_bf16(bits(0x7f800001u)))) << "a NaN whose payload is below bf16's stays NaN";
    EXPECT_EQ(from_bf16(to_bf16(-2.5f)), -2.5f);
}

}  // namespace
}  // namespace kvlab
