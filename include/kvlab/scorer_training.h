// Training KVzap's surrogate for one model on the CPU (`kvlab train-scorer`; docs/kvzap.md): the
// corpus is cut into texts of about doc_tokens tokens, each prefilled as a context (the user turn
// evaluation contexts take) and scored by KVzip+ (kvzip with plus=true: its repeat passes); for
// rows sampled in each text, the hidden state entering every layer's attention and the log of
// the row's KVzip+ score per KV head are one sample. A share of the texts is held out: the fit
// on them (R^2, Spearman, per layer) goes into the scorer file with the run's provenance. The
// linear surrogate is a ridge fit from streamed sums; the MLP keeps the samples (their hidden
// states in bf16) and is trained by AdamW (press/mlp_fit.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvlab/engine.h"
#include "kvlab/surrogate.h"
#include "kvlab/text.h"

namespace kvlab {

struct CorpusText {
    std::string name;  // where it came from (a path), for the provenance
    std::string text;
};

struct ScorerTrainingOptions {
    Surrogate::Kind kind = Surrogate::Kind::linear;
    int64_t tokens = 131072;        // corpus tokens used in all (training and held-out texts)
    int64_t doc_tokens = 1024;      // tokens per text (kvpress: 750 to 1,250)
    int64_t samples_per_doc = 500;  // rows sampled per text (kvpress: 500)
    double holdout = 0.1;           // share of the texts held out for the fit report
    double alpha = 1.0;             // linear: the ridge penalty (scikit-learn's default, kvpress's)
    // mlp (kvpress's kvzap/train.py): hidden units, epochs, AdamW's first learning rate (cosine-
    // annealed to 0 over the epochs), samples per batch. Its other settings are kvpress's: weight
    // decay 0.01, gradient norm clipped to 1, 5% of the samples held out for a validation loss.
    int n_hidden = 512;
    int epochs = 15;
    double lr = 5e-3;
    int batch = 512;
    uint64_t seed = 0;  // which texts are held out and which rows are sampled; the MLP's start and order
    // Called after each text: (texts done, texts in all, "training" or "held-out").
    std::function<void(int64_t, int64_t, const char *)> progress;
    // mlp: called after each epoch: (epochs done, epochs, training loss, validation loss, seconds
    // since the MLPs' training began), the losses averaged over the layers.
    std::function<void(int, int, double, double, double)> epoch_progress;
};

// Trains the surrogate. Throws kvlab::Error when the corpus gives fewer than two training texts
// and one held-out text. The returned surrogate's `model`, `training` and `fit` are filled in.
Surrogate train_scorer(Engine & engine, const Tokenizer & tok, const std::vector<CorpusText> & corpus,
                       const ScorerTrainingOptions & opts);

// Spearman's rank correlation (average ranks for ties); 0 when either side is constant.
double spearman(const std::vector<float> & a, const std::vector<float> & b);

}  // namespace kvlab
