// train_scorer: KVzip+ targets from kvzip's own repeat passes, ridge fits per layer (RidgeFit) or
// MLPs trained on the kept samples (fit_mlp), the fit on held-out texts.
#include "kvlab/scorer_training.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <numeric>
#include <random>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/sys.h"
#include "press/mlp_fit.h"

namespace kvlab {

namespace {

constexpr int64_t k_unscored = 4;  // kvzip's sinks: no score of their own

// The hidden states (X [layer][m][n_embd]) and log KVzip+ scores (Y [layer][m][n_head_kv]) of
// m rows sampled from one text's context.
struct DocSamples {
    int64_t m = 0;
    std::vector<std::vector<float>> x, y;
};

// kvzip: the KVzip+ press, one for the whole run (its W_o Gram matrices are made once).
DocSamples collect(Engine & engine, const Tokenizer & tok, Press & kvzip, const std::string & text, int64_t samples,
                   std::mt19937_64 & rng) {
    const Model & model = engine.model();
    const HParams & hp = model.hparams();
    const std::vector<int32_t> ctx = tok.context_prompt(text, "").context;
    const int64_t L = int64_t(ctx.size());
    DocSamples d;
    if (L <= k_unscored) return d;
    std::vector<int64_t> rows(size_t(L - k_unscored));
    std::iota(rows.begin(), rows.end(), k_unscored);
    d.m = std::min<int64_t>(samples, int64_t(rows.size()));
    for (int64_t i = 0; i < d.m; ++i)
        std::swap(rows[size_t(i)], rows[size_t(i + int64_t(rng() % uint64_t(int64_t(rows.size()) - i)))]);
    rows.resize(size_t(d.m));
    std::sort(rows.begin(), rows.end());
    d.x.assign(size_t(hp.n_layer), std::vector<float>(size_t(d.m * hp.n_embd)));
    d.y.assign(size_t(hp.n_layer), std::vector<float>(size_t(d.m * hp.n_head_kv)));

    QueryObserver hidden;
    hidden.on_hidden = [&](int il, int64_t tok0, int64_t n, const float * x) {
        auto it = std::lower_bound(rows.begin(), rows.end(), tok0);
        for (; it != rows.end() && *it < tok0 + n; ++it)
            std::copy_n(x + (*it - tok0) * hp.n_embd, hp.n_embd,
                        d.x[size_t(il)].begin() + (it - rows.begin()) * hp.n_embd);
    };
    KvStore cache = engine.new_cache(L);
    cache.hold_all_rows(true);  // kvzip scores every layer's rows (sliding-window ones too)
    engine.prefill(cache, ctx, nullptr, nullptr, &hidden);
    for (const ScoringPass & pass : kvzip.scoring_passes(cache, ctx, tok)) {
        engine.prefill(cache, pass.tokens, nullptr, nullptr, pass.observer);
        cache.rollback(int64_t(pass.tokens.size()));
    }
    const Press::RowScores s = kvzip.last_scores();
    for (int il = 0; il < hp.n_layer; ++il)
        for (int64_t i = 0; i < d.m; ++i)
            for (int h = 0; h < hp.n_head_kv; ++h)  // log(0) where every probability underflowed: the floor
                d.y[size_t(il)][size_t(i * hp.n_head_kv + h)] =
                    std::log(std::max(s.s[size_t(il)][size_t(h)][size_t(rows[size_t(i)])], 1e-30f));
    return d;
}

std::vector<double> ranks(const std::vector<float> & v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
        size_t j = i;
        while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
        for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j);  // average rank of the ties
        i = j + 1;
    }
    return r;
}

// R^2 of predictions p against truths t, [m][n_out] each, averaged over the outputs
// (scikit-learn's r2_score, multioutput="uniform_average").
double r2(const std::vector<float> & t, const std::vector<float> & p, int n_out) {
    const size_t m = t.size() / size_t(n_out);
    double sum = 0.0;
    for (int o = 0; o < n_out; ++o) {
        double mean = 0.0, res = 0.0, tot = 0.0;
        for (size_t i = 0; i < m; ++i) mean += t[i * n_out + o];
        mean /= double(m);
        for (size_t i = 0; i < m; ++i) {
            res += std::pow(double(t[i * n_out + o]) - p[i * n_out + o], 2);
            tot += std::pow(double(t[i * n_out + o]) - mean, 2);
        }
        sum += tot > 0 ? 1.0 - res / tot : 0.0;
    }
    return sum / n_out;
}

// Trains the MLP of every layer on its kept samples (fit_mlp) over the engine's threads, each
// thread its own layers; returns the training's record for the scorer file.
nlohmann::json train_mlp(const Engine & engine, const std::vector<MlpSamples> & kept, const ScorerTrainingOptions & o,
                         std::vector<Surrogate::Layer> & layers) {
    const HParams & hp = engine.model().hparams();
    MlpFitOptions mo;
    mo.n_hidden = o.n_hidden;
    mo.epochs = o.epochs;
    mo.lr = o.lr;
    mo.batch = o.batch;
    const int threads = engine.options().n_threads > 0 ? engine.options().n_threads : engine.model().refresh_threads();
    uint64_t sample_bytes = 0;
    for (const MlpSamples & k : kept) sample_bytes += k.x.size() * sizeof(uint16_t) + k.y.size() * sizeof(float);
    const double t0 = now_seconds();
    MlpFit f = fit_mlp(kept, hp.n_embd, hp.n_head_kv, mo, o.seed, threads, o.epoch_progress);
    layers = std::move(f.layers);
    const auto mean = [&](const std::vector<std::vector<double>> & per_layer) {
        std::vector<double> m(per_layer[0].size(), 0.0);
        for (const auto & l : per_layer)
            for (size_t e = 0; e < l.size(); ++e) m[e] += l[e] / double(per_layer.size());
        return m;
    };
    nlohmann::json per_layer = nlohmann::json::array();
    for (size_t il = 0; il < f.train_loss.size(); ++il)
        per_layer.push_back({{"train_loss", f.train_loss[il]}, {"valid_loss", f.valid_loss[il]}});
    return {{"n_hidden", mo.n_hidden},
            {"activation", "GELU (erf)"},
            {"epochs", mo.epochs},
            {"lr", mo.lr},
            {"lr_schedule", "cosine annealing per epoch to 0 (T_max = epochs)"},
            {"batch", mo.batch},
            {"optimizer", "AdamW"},
            {"betas", {mo.beta1, mo.beta2}},
            {"eps", mo.eps},
            {"weight_decay", mo.weight_decay},
            {"clip_grad_norm", mo.clip},
            {"loss", "MSE"},
            {"init", "torch nn.Linear: uniform within +-1/sqrt(fan_in)"},
            {"inputs", "hidden states as bf16 (round to nearest even)"},
            {"sample_bytes", sample_bytes},
            {"valid_share", mo.valid},
            {"train_samples", f.n_train},
            {"valid_samples", f.n_valid},
            {"train_loss", mean(f.train_loss)},
            {"valid_loss", f.n_valid > 0 ? nlohmann::json(mean(f.valid_loss)) : nlohmann::json::array()},
            {"fit_seconds", now_seconds() - t0},
            {"layers", per_layer}};
}

}  // namespace

double spearman(const std::vector<float> & a, const std::vector<float> & b) {
    if (a.size() != b.size() || a.size() < 2) return 0.0;
    const std::vector<double> ra = ranks(a), rb = ranks(b);
    const double n = double(a.size()), mean = (n - 1) / 2;
    double sab = 0.0, saa = 0.0, sbb = 0.0;
    for (size_t i = 0; i < ra.size(); ++i) {
        sab += (ra[i] - mean) * (rb[i] - mean);
        saa += (ra[i] - mean) * (ra[i] - mean);
        sbb += (rb[i] - mean) * (rb[i] - mean);
    }
    return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

Surrogate train_scorer(Engine & engine, const Tokenizer & tok, const std::vector<CorpusText> & corpus,
                       const ScorerTrainingOptions & o) {
    const Model & model = engine.model();
    const HParams & hp = model.hparams();
    const bool mlp = o.kind == Surrogate::Kind::mlp;
    if (mlp && (o.n_hidden < 1 || o.epochs < 1 || o.batch < 1 || !(o.lr > 0)))
        throw Error("train-scorer", "the MLP needs hidden >= 1, epochs >= 1, batch >= 1 and lr > 0");
    if (o.doc_tokens < 64 || o.samples_per_doc < 1 || o.tokens < o.doc_tokens || !(o.holdout > 0 && o.holdout < 1))
        throw Error("train-scorer", "doc_tokens >= 64, samples >= 1, tokens >= doc_tokens and 0 < holdout < 1");
    // texts of doc_tokens tokens cut from every corpus file, shuffled, then taken up to `tokens`
    struct Doc {
        std::string text;
        size_t src;
        int64_t tokens;
    };
    std::vector<Doc> all;
    for (size_t i = 0; i < corpus.size(); ++i) {
        const std::vector<int32_t> ids = tok.encode(corpus[i].text, false, false);
        for (size_t off = 0; off + size_t(o.doc_tokens / 2) <= ids.size(); off += size_t(o.doc_tokens)) {
            const size_t end = std::min(ids.size(), off + size_t(o.doc_tokens));
            all.push_back({tok.decode(std::vector<int32_t>(ids.begin() + long(off), ids.begin() + long(end))), i,
                           int64_t(end - off)});
        }
    }
    std::mt19937_64 rng(o.seed);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<Doc> docs;
    int64_t used = 0;
    for (Doc & d : all) {
        if (used >= o.tokens) break;
        used += d.tokens;
        docs.push_back(std::move(d));
    }
    const int64_t n_hold = std::max<int64_t>(1, std::llround(o.holdout * double(docs.size())));
    if (int64_t(docs.size()) - n_hold < 2)
        throw Error("train-scorer", "the corpus gives " + std::to_string(docs.size()) + " texts of " +
                                        std::to_string(o.doc_tokens) +
                                        " tokens: too few to train on and hold some out (give more text or --tokens)");
    const int64_t n_train = int64_t(docs.size()) - n_hold;

    const std::unique_ptr<Press> kvzip = make_press("kvzip", {{"plus", "true"}}, model);
    // linear: streamed into sums; mlp: kept, the hidden states as bf16 (the MLP's epochs see them all)
    std::vector<RidgeFit> fits(mlp ? 0 : size_t(hp.n_layer), RidgeFit(hp.n_embd, hp.n_head_kv));
    std::vector<MlpSamples> kept(mlp ? size_t(hp.n_layer) : 0);
    for (MlpSamples & k : kept) {
        k.x.reserve(size_t(n_train * o.samples_per_doc * hp.n_embd));
        k.y.reserve(size_t(n_train * o.samples_per_doc * hp.n_head_kv));
    }
    int64_t n_samples = 0;
    const double t0 = now_seconds();
    for (int64_t i = 0; i < n_train; ++i) {
        const DocSamples d = collect(engine, tok, *kvzip, docs[size_t(i)].text, o.samples_per_doc, rng);
        for (int il = 0; il < hp.n_layer; ++il) {
            if (!mlp) {
                fits[size_t(il)].add(d.x[size_t(il)].data(), d.y[size_t(il)].data(), d.m);
                continue;
            }
            MlpSamples & k = kept[size_t(il)];
            std::transform(d.x[size_t(il)].begin(), d.x[size_t(il)].end(), std::back_inserter(k.x), to_bf16);
            k.y.insert(k.y.end(), d.y[size_t(il)].begin(), d.y[size_t(il)].end());
        }
        n_samples += d.m;
        if (o.progress) o.progress(i + 1, int64_t(docs.size()), "training");
    }
    std::vector<Surrogate::Layer> layers(size_t(hp.n_layer));
    nlohmann::json mlp_record;
    if (!mlp) {
        for (int il = 0; il < hp.n_layer; ++il)
            fits[size_t(il)].solve(o.alpha, layers[size_t(il)].w1, layers[size_t(il)].b1);
    } else {
        mlp_record = train_mlp(engine, kept, o, layers);
        kept = {};  // freed before the held-out texts
    }
    Surrogate s(o.kind, hp.n_embd, hp.n_head_kv, mlp ? o.n_hidden : 0, std::move(layers));

    // the fit on the held-out texts
    std::vector<std::vector<float>> truth(size_t(hp.n_layer)), pred(size_t(hp.n_layer));
    int64_t n_test = 0;
    for (int64_t i = n_train; i < int64_t(docs.size()); ++i) {
        const DocSamples d = collect(engine, tok, *kvzip, docs[size_t(i)].text, o.samples_per_doc, rng);
        for (int il = 0; il < hp.n_layer; ++il) {
            std::vector<float> y(size_t(d.m * hp.n_head_kv));
            s.predict(il, d.x[size_t(il)].data(), d.m, y.data());
            pred[size_t(il)].insert(pred[size_t(il)].end(), y.begin(), y.end());
            truth[size_t(il)].insert(truth[size_t(il)].end(), d.y[size_t(il)].begin(), d.y[size_t(il)].end());
        }
        n_test += d.m;
        if (o.progress) o.progress(i + 1, int64_t(docs.size()), "held-out");
    }
    nlohmann::json per_layer = nlohmann::json::array();
    double r2_sum = 0.0, rho_sum = 0.0;
    for (int il = 0; il < hp.n_layer; ++il) {
        const double r = r2(truth[size_t(il)], pred[size_t(il)], hp.n_head_kv);
        const double rho = spearman(truth[size_t(il)], pred[size_t(il)]);
        per_layer.push_back({{"layer", il}, {"r2", r}, {"spearman", rho}});
        r2_sum += r;
        rho_sum += rho;
    }
    s.fit = {{"held_out_texts", n_hold},
             {"held_out_samples", n_test},
             {"mean_r2", r2_sum / hp.n_layer},
             {"mean_spearman", rho_sum / hp.n_layer},
             {"layers", per_layer}};
    nlohmann::json sources = nlohmann::json::array();
    for (const CorpusText & c : corpus)
        sources.push_back(
            {{"name", c.name}, {"bytes", c.text.size()}, {"sha256", sha256_hex(c.text.data(), c.text.size())}});
    s.training = {
        {"target", "log KVzip+ score (kvzip plus=true: repeat passes, max over repeat queries and the GQA group)"},
        {"corpus", sources},
        {"tokens", used},
        {"texts", docs.size()},
        {"training_texts", n_train},
        {"training_samples", n_samples},
        {"doc_tokens", o.doc_tokens},
        {"samples_per_doc", o.samples_per_doc},
        {"holdout", o.holdout},
        {"alpha", o.alpha},
        {"seed", o.seed},
        {"seconds", now_seconds() - t0}};
    if (mlp) {
        s.training.erase("alpha");
        s.training["mlp"] = mlp_record;
    }
    s.model = {{"name", std::filesystem::path(model.path()).filename().string()},
               {"sha256", model.file_sha256()},
               {"arch", hp.arch}};
    return s;
}

}  // namespace kvlab
