// The press around a caller's scoring function (include/kvlab/callback_press.h): the prefill's
// observers it asked for, one call per layer, the scores checked, then kvlab's own selection.
#include "kvlab/callback_press.h"

#include <cmath>
#include <cstring>

#include "kvlab/error.h"
#include "press/hidden_states.h"
#include "press/method.h"
#include "press/policy.h"
#include "press/window_attention.h"
#include "press/window_queries.h"

namespace kvlab {

namespace {

// The selection of kvlab's policies (press/policy.h) for `per`.
press::Policy policy_for(const CallbackScorer & sp) {
    if (sp.per == "uniform" || sp.per == "layer") return press::uniform_policy();  // layer: s.per_layer
    if (sp.per == "model")  // one ranking over every compressed layer and head, as KVzip's
        return [](const press::Scores & s, const Budget & b, const KvStore & cache) {
            return press::select_global(s, b.per_layer(s.L), compressed_layers(cache, b));
        };
    return press::adakv_policy(sp.alpha, false);  // global: Ada-KV's, as the adakv wrapper's
}

class CallbackScorerImpl : public press::Scorer {
public:
    CallbackScorerImpl(CallbackScorer sp, const Model & m) : sp_(std::move(sp)), model_(m), hp_(m.hparams()) {}

    const QueryObserver * observer(KvStore &, int64_t L, double * observe_s) override {
        observers_ = std::make_unique<ObserverSet>(model_);
        if (sp_.observed > 0) observers_->add(window_.observe(hp_, sp_.observed, L, observe_s));
        if (sp_.hidden_states) observers_->add(hidden_.observe(hp_, L, observe_s));
        scored_ = false;
        return observers_->get();
    }

    // The function's answers, asked once per compression (compress() plans twice for a byte budget
    // that demotes, and a session plans once per budget).
    press::Scores score(const KvStore & cache) override {
        if (scored_) return scores_;
        const int64_t L = cache.n_rows(0, 0);
        if ((sp_.observed > 0 && !window_.complete(L)) || (sp_.hidden_states && !hidden_.complete(L)))
            throw Error("scorer", sp_.name + ": the context's prefill was not observed");
        press::Scores s;
        s.L = L;
        s.n_sink = std::min(sp_.n_sink, L);
        s.window = std::min(sp_.window, L);
        s.per_layer = sp_.per == "layer";
        s.s.resize(size_t(cache.n_layer()));
        const int H = cache.n_head_kv(), d = cache.head_dim();
        for (int il = 0; il < cache.n_layer(); ++il) {
            LayerRows rows;
            rows.layer = il;
            rows.rows = L;
            rows.keys.resize(size_t(H) * L * d);
            rows.values.resize(size_t(H) * L * d);
            for (int h = 0; h < H; ++h) {  // F16 / quantized rows to float32, the heads side by side
                const std::vector<float> kh = press::keys(cache, il, h), vh = press::values(cache, il, h);
                std::copy(kh.begin(), kh.end(), rows.keys.begin() + size_t(h) * L * d);
                std::copy(vh.begin(), vh.end(), rows.values.begin() + size_t(h) * L * d);
            }
            if (sp_.observed > 0) rows.window_rows = window_.rows();
            if (sp_.queries) rows.queries = queries(il);
            if (sp_.attentions) rows.attentions = attentions(cache, il, rows.keys);
            if (sp_.hidden_states) rows.hidden = hidden_.take(il);
            s.s[size_t(il)] = checked(sp_.score(std::move(rows)), il, H, s);
        }
        if (s.per_layer)  // one row set per layer: the heads' mean
            for (auto & layer : s.s) {
                std::vector<float> mean(static_cast<size_t>(L));
                for (int64_t j = 0; j < L; ++j) {
                    double sum = 0.0;
                    for (const auto & head : layer) sum += head[size_t(j)];
                    mean[size_t(j)] = float(sum / double(layer.size()));
                }
                for (auto & head : layer) head = mean;
            }
        scores_ = std::move(s);
        scored_ = true;
        return scores_;
    }

private:
    // [n_head][w][head_dim] of layer il (the observer keeps [w][n_head][head_dim]).
    std::vector<float> queries(int il) const {
        const int64_t nh = hp_.n_head, d = hp_.head_dim, w = window_.rows();
        std::vector<float> out(size_t(nh * w * d));
        for (int64_t r = 0; r < w; ++r)
            for (int64_t h = 0; h < nh; ++h)
                std::memcpy(out.data() + (h * w + r) * d, window_.layer(il) + (r * nh + h) * d,
                            size_t(d) * sizeof(float));
        return out;
    }

    // Layer il's window attention [n_head][w][L] (press/window_attention.h) from the window's
    // queries and the keys k [kv_heads][L][head_dim]. The cache is a plain prefill: every head
    // holds the same rows.
    std::vector<float> attentions(const KvStore & cache, int il, const std::vector<float> & k) const {
        const std::vector<int32_t> & pos = cache.positions(il, 0);
        return press::window_attention_weights(hp_, il, window_.layer(il), window_.rows(), k.data(), pos.data(),
                                               int64_t(pos.size()), model_.n_threads());
    }

    // The answer for layer il: [kv_heads][L], finite wherever it ranks.
    std::vector<std::vector<float>> checked(std::vector<std::vector<float>> r, int il, int H,
                                            const press::Scores & s) const {
        const std::string where = sp_.name + " (layer " + std::to_string(il) + ")";
        if (int(r.size()) != H)
            throw Error("scorer", where + " gave scores for " + std::to_string(r.size()) + " heads; the layer has " +
                                      std::to_string(H));
        for (int h = 0; h < H; ++h) {
            if (int64_t(r[size_t(h)].size()) != s.L)
                throw Error("scorer", where + " gave " + std::to_string(r[size_t(h)].size()) + " scores for head " +
                                          std::to_string(h) + "; the layer holds " + std::to_string(s.L) + " rows");
            for (int64_t j = 0; j < s.L; ++j)
                if (!s.is_forced(j) && !std::isfinite(r[size_t(h)][size_t(j)]))
                    throw Error("scorer", where + " returned a non-finite score (" +
                                              std::to_string(r[size_t(h)][size_t(j)]) + ") for head " +
                                              std::to_string(h) + ", row " + std::to_string(j));
        }
        return r;
    }

    CallbackScorer sp_;
    const Model & model_;
    HParams hp_;
    press::WindowQueries window_;
    press::HiddenStates hidden_;
    std::unique_ptr<ObserverSet> observers_;
    press::Scores scores_;
    bool scored_ = false;
};

class CallbackPress : public Press {
public:
    CallbackPress(CallbackScorer sp, const Model & m) : policy_(policy_for(sp)) {
        name_ = sp.name;
        params_ = {{"per", sp.per},
                   {"n_sink", sp.n_sink},
                   {"window", sp.window},
                   {"window_queries", sp.observed},
                   {"attentions", sp.attentions},
                   {"hidden_states", sp.hidden_states}};
        if (sp.per == "global") params_["alpha"] = sp.alpha;
        observes_ = sp.observes();
        scorer_ = std::make_unique<CallbackScorerImpl>(std::move(sp), m);
    }
    const QueryObserver * observer(KvStore & cache, int64_t L) override {
        observe_s_ = 0.0;
        return scorer_->observer(cache, L, &observe_s_);
    }
    KeepPlan plan(const KvStore & cache, const Budget & budget) override {
        if (!cache.uniform())
            throw Error("scorer", name_ +
                                      ": the cache must hold the same rows in every layer and head (it is "
                                      "already compressed)");
        return policy_(scorer_->score(cache), budget, cache);
    }

private:
    press::Policy policy_;
    std::unique_ptr<CallbackScorerImpl> scorer_;
};

}  // namespace

std::unique_ptr<Press> make_callback_press(CallbackScorer sp, const Model & model) {
    if (sp.per != "uniform" && sp.per != "layer" && sp.per != "global" && sp.per != "model")
        throw Error("scorer", "per must be uniform, layer, global or model, not '" + sp.per + "'");
    if (sp.n_sink < 0 || sp.window < 0) throw Error("scorer", "n_sink and window cannot be negative");
    if (sp.observed < 0) throw Error("scorer", "the scorer's window_queries cannot be negative");
    if (!(sp.alpha >= 0.0 && sp.alpha <= 1.0)) throw Error("scorer", "alpha must lie in [0, 1]");
    if (!sp.score) throw Error("scorer", sp.name + ": no scoring function");
    if (sp.observed == 0 && (sp.queries || sp.attentions)) {
        if (sp.window < 1)
            throw Error("scorer", sp.name + " asks for the window's " + (sp.attentions ? "attentions" : "queries") +
                                      ": set its window_queries (or window >= 1)");
        sp.observed = sp.window;
    }
    return std::make_unique<CallbackPress>(std::move(sp), model);
}

}  // namespace kvlab
