// Training KVzap's MLP surrogate (docs/kvzap.md "The MLP"), as kvpress's kvzap/train.py defines it:
// per layer Linear(n_in -> n_hidden), GELU (erf), Linear(n_hidden -> n_out), MSE on the log KVzip+
// targets, AdamW (torch's defaults but weight decay 0.01), shuffled batches, the learning rate
// annealed by a cosine per epoch (T_max = epochs), the gradient's norm clipped, a share of the
// samples held out for a validation loss (skorch's ValidSplit). Weights start as torch's
// nn.Linear's (uniform within +-1/sqrt(fan_in)), drawn from the seed: the same samples and seed
// give the same bits at every thread count (each layer is trained by one thread; its products
// by Eigen, single-threaded, with the same blocking whatever the thread count).
// kvpress trains every layer's MLP in one module: one loss over all layers, one AdamW, the
// gradient clipped by its norm over all layers. Here each layer is trained on its own (its own
// loss, AdamW and clipping by its own gradient's norm), so that layers train in parallel; the
// layers share no parameter, so only the clipping (and AdamW's eps) differ.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "kvlab/surrogate.h"

namespace kvlab {

struct MlpFitOptions {
    int n_hidden = 512;
    int epochs = 15;
    double lr = 5e-3;  // the first epoch's; cosine-annealed to 0 over the epochs
    int batch = 512;
    double weight_decay = 0.01;  // AdamW's, on every parameter (torch's default parameter group)
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double clip = 1.0;    // the gradient's L2 norm (over one layer's parameters) is clipped to this
    double valid = 0.05;  // share of the samples held out of the training for the validation loss
};

// bfloat16, rounded to nearest even (NaN stays NaN): how the samples' hidden states are kept.
uint16_t to_bf16(float f);
inline float from_bf16(uint16_t h) {
    return std::bit_cast<float>(uint32_t(h) << 16);
}

// One layer's samples: hidden states x [m][n_in] in bf16, targets y [m][n_out].
struct MlpSamples {
    std::vector<uint16_t> x;
    std::vector<float> y;
};

// One layer's MLP and its AdamW state.
class MlpTrainer {
public:
    MlpTrainer(int n_in, int n_out, const MlpFitOptions & o, uint64_t seed);
    const Surrogate::Layer & params() const { return p_; }
    // The last step's gradient of the loss, before clipping.
    const Surrogate::Layer & grad() const { return g_; }
    // One AdamW step at learning rate lr on the batch x [b][n_in], y [b][n_out]; returns the
    // batch's mean squared error before the step.
    double step(const float * x, const float * y, int64_t b, double lr);
    // The mean squared error over n samples (kept as bf16), by batches.
    double loss(const MlpSamples & s, const std::vector<int64_t> & rows) const;
    // One epoch over `rows` of s in a fresh order; returns the mean of the batches' losses
    // weighted by their sizes (skorch's train_loss).
    double epoch(const MlpSamples & s, std::vector<int64_t> & rows, double lr);

private:
    int n_in_, n_out_, n_hidden_;
    MlpFitOptions o_;
    std::mt19937_64 rng_;             // the weights' initial values, then each epoch's order
    Surrogate::Layer p_, g_, m_, v_;  // parameters, gradient, AdamW's moments
    int64_t t_ = 0;                   // steps taken
};

struct MlpFit {
    std::vector<Surrogate::Layer> layers;
    std::vector<std::vector<double>> train_loss, valid_loss;  // [layer][epoch]
    int64_t n_train = 0, n_valid = 0;                         // samples per layer
};

// Trains one MLP per layer of `data` (every layer holds the same m samples; the validation
// split is the same rows for all) with `threads` threads, each its own layers, epoch by epoch.
// progress(epoch done, epochs, mean training loss, mean validation loss over the layers,
// seconds since the training began) after each epoch. Throws kvlab::Error for empty data or options out of range.
MlpFit fit_mlp(const std::vector<MlpSamples> & data, int n_in, int n_out, const MlpFitOptions & o, uint64_t seed,
               int threads, const std::function<void(int, int, double, double, double)> & progress = nullptr);

}  // namespace kvlab
