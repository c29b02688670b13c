// KVzap (docs/methods.md; arXiv 2601.07891; kvpress KVzapPress + DMSPress/ThresholdPress):
// query-agnostic, learned. A per-layer surrogate (linear or MLP, `kvlab train-scorer`) maps the
// hidden state entering each layer's attention, taken from the normal prefill (no extra pass),
// to the predicted log KVzip+ score of the token's row per KV head. With a ratio or token
// budget, one global threshold over every (layer, head, row) as KVzip; with `threshold`, the
// rows predicted at or above it are kept whatever their number (kvpress's threshold mode). The
// last `window` rows are always kept. Rows are freed (kvpress masks them).
#include <chrono>

#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class KvzapScorer : public Scorer {
public:
    KvzapScorer(const Params & p, const Model & m)
        : hp_(m.hparams()), n_threads_(m.n_threads()), window_(p.get_int("window")), n_sink_(p.get_int("n_sink")) {
        if (window_ < 0 || n_sink_ < 0) throw Error("press", "kvzap: window and n_sink cannot be negative");
        surrogate_ = scorer_for(m, p.get_string("scorer"), Surrogate::kind_of(p.get_string("kind")));
    }

    const QueryObserver * observer(KvStore & cache, int64_t L, double * observe_s) override {
        L_ = L;
        s_.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv, std::vector<float>(size_t(L), 0.0f)));
        seen_.assign(hp_.n_layer, 0);
        obs_ = QueryObserver{};
        obs_.on_hidden = [this, observe_s](int il, int64_t tok0, int64_t n, const float * x) {
            if (tok0 >= L_) return;
            const auto t0 = std::chrono::steady_clock::now();
            n = std::min(n, L_ - tok0);
            std::vector<float> y(size_t(n * hp_.n_head_kv));
            // the chunk's rows split over the model's threads (idle while the observer runs)
            const int64_t T = std::max<int64_t>(1, std::min<int64_t>(n_threads_, n));
            parallel_for(T, int(T), [&](int64_t b) {
                const int64_t r0 = n * b / T, r1 = n * (b + 1) / T;
                surrogate_.predict(il, x + r0 * hp_.n_embd, r1 - r0, y.data() + r0 * hp_.n_head_kv);
            });
            for (int64_t r = 0; r < n; ++r)
                for (int h = 0; h < hp_.n_head_kv; ++h) s_[il][h][size_t(tok0 + r)] = y[size_t(r * hp_.n_head_kv + h)];
            seen_[il] += n;
            *observe_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };
        return &obs_;
    }

    Scores score(const KvStore & cache) override {
        for (int64_t seen : seen_)
            if (seen != L_ || L_ == 0) throw Error("press", "kvzap: the context's prefill was not observed");
        Scores s;
        s.L = L_;
        s.n_sink = std::min(n_sink_, L_);
        s.window = std::min(window_, L_ - s.n_sink);
        s.s = s_;
        return s;
    }

private:
    HParams hp_;
    int n_threads_;
    int64_t window_, n_sink_;
    Surrogate surrogate_;
    int64_t L_ = 0;
    std::vector<int64_t> seen_;
    std::vector<std::vector<std::vector<float>>> s_;  // [layer][head][L] predicted log KVzip+ scores
    QueryObserver obs_;
};

const MethodRegistrar reg([] {
    Registration r;
    r.info = MethodInfo{
        "kvzap",
        "query-agnostic, learned: a per-layer surrogate predicts each row's log KVzip+ score from the hidden state "
        "of the normal prefill (no extra pass; `kvlab train-scorer` trains it); one global threshold as kvzip, or "
        "a fixed score threshold",
        {{"scorer", "", "the scorer file (default: the model's in kvlab's cache, scorers/<sha256>-<kind>.kvzap)"},
         {"kind", "linear", "the default scorer's kind: linear (ridge) or mlp", {"linear", "mlp"}},
         {"threshold", "",
          "keep the rows whose predicted log score is at least this (kvpress ThresholdPress; the budget is then "
          "not used and the achieved ratio is reported); empty: the budget decides"},
         {"window", "128", "last rows every head keeps (kvpress DMSPress's recent window)"},
         {"n_sink", "4",
          "first rows every head keeps (KVzip's sinks: the surrogate is trained on the rows after them)"}},
        false,
        true,
        {{"n_sink", "0"}},
        "kvlab frees the rows kvpress masks; with a ratio, one global threshold over layers and heads (kvpress's "
        "ScorerPress: the same count per head); the surrogate is kvlab's own, trained on KVzip+ scores of its "
        "repeat passes (kvpress's: full attention over one repeat turn, Nemotron texts)",
        "n_sink 4: KVzip's sinks, never scored in training, are kept (kvpress's DMSPress keeps none)"};
    r.make = [](const Params & p, const Model & m) -> std::unique_ptr<Press> {
        const bool by_threshold = !p.get_string("threshold").empty();
        const float threshold = by_threshold ? float(p.get_float("threshold")) : 0.0f;
        Policy policy = [by_threshold, threshold](const Scores & s, const Budget & b, const KvStore & cache) {
            const std::vector<int> layers = compressed_layers(cache, b);
            return by_threshold ? select_threshold(s, threshold, layers) : select_global(s, b.per_layer(s.L), layers);
        };
        return scored_press(std::make_unique<KvzapScorer>(p, m), std::move(policy));
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
