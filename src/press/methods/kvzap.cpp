// KVzap (docs/methods.md; arXiv 2601.07891; kvpress KVzapPress + DMSPress/ThresholdPress):
// query-agnostic, learned. A per-layer surrogate (linear or MLP, `kvlab train-scorer`) maps the
// hidden state entering each layer's attention, taken from the normal prefill (no extra pass),
// to the predicted log KVzip+ score of the token's row per KV head. With a ratio or token
// budget, one global threshold over every (layer, head, row) as KVzip; with `threshold`, the
// rows predicted at or above it are kept whatever their number (kvpress's threshold mode). The
// last `window` rows are always kept. Rows are freed (kvpress masks them).
#include <chrono>
#include <limits>

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

// While decoding (DMSPress's threshold): each generated row is scored by the surrogate from the
// hidden state of its own decoding step; the context's rows are not scored (+inf: they stay).
class KvzapSegments : public SegmentScorer {
public:
    KvzapSegments(std::shared_ptr<const Surrogate> zap, const HParams & hp, Threshold t)
        : zap_(std::move(zap)), hp_(hp), t_(t) {
        pending_.assign(size_t(hp_.n_layer), std::vector<float>(size_t(hp_.n_head_kv)));
        obs_.on_hidden = [this](int il, int64_t, int64_t n, const float * x) {
            zap_->predict(il, x + (n - 1) * hp_.n_embd, 1, pending_[size_t(il)].data());
        };
    }
    const QueryObserver * observer() override { return &obs_; }
    std::optional<Threshold> threshold() const override { return t_; }
    std::unique_ptr<SegmentScorer> another() const override { return std::make_unique<KvzapSegments>(zap_, hp_, t_); }
    void start(const KvStore & cache) override {
        generated_.assign(size_t(cache.n_layer()),
                          std::vector<std::vector<std::pair<int32_t, float>>>(size_t(cache.n_head_kv())));
    }
    void after_token(const KvStore & cache) override {
        const int32_t pos = cache.next_pos() - 1;
        for (int il = 0; il < hp_.n_layer; ++il)
            for (int h = 0; h < hp_.n_head_kv; ++h)
                generated_[size_t(il)][size_t(h)].emplace_back(pos, pending_[size_t(il)][size_t(h)]);
    }
    std::vector<float> score(const KvStore & cache, int il, int h) override {
        const std::vector<int32_t> & pos = cache.positions(il, h);
        const auto & gen = generated_[size_t(il)][size_t(h)];
        std::vector<float> out(pos.size(), std::numeric_limits<float>::infinity());
        size_t g = 0;
        for (size_t r = 0; r < pos.size(); ++r) {
            while (g < gen.size() && gen[g].first < pos[r]) ++g;
            if (g < gen.size() && gen[g].first == pos[r]) out[r] = gen[g].second;
        }
        return out;
    }
    // the predictions of the rows still held (both lists ascend by position)
    void compressed(const KvStore & cache) override {
        for (int il = 0; il < cache.n_layer(); ++il)
            for (int h = 0; h < cache.n_head_kv(); ++h) {
                const std::vector<int32_t> & pos = cache.positions(il, h);
                auto & gen = generated_[size_t(il)][size_t(h)];
                std::vector<std::pair<int32_t, float>> still;
                size_t r = 0;
                for (const auto & e : gen) {
                    while (r < pos.size() && pos[r] < e.first) ++r;
                    if (r < pos.size() && pos[r] == e.first) still.push_back(e);
                }
                gen = std::move(still);
            }
    }

private:
    std::shared_ptr<const Surrogate> zap_;
    HParams hp_;
    Threshold t_;
    QueryObserver obs_;
    std::vector<std::vector<float>> pending_;  // [layer][head] the last decoded token's predictions
    // [layer][head] (position, predicted log score) of the generated rows still held
    std::vector<std::vector<std::vector<std::pair<int32_t, float>>>> generated_;
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
    r.segment = [info = r.info](const ParamMap & params, const Model & m) -> std::unique_ptr<SegmentScorer> {
        // the method's own parameters, checked as `--param` is; n_sink does not apply (the
        // context's rows stay)
        if (params.count("n_sink"))
            throw Error("decode-policy", "kvzap while decoding keeps every context row: no n_sink");
        const Params p("kvzap", info.params, params);
        if (p.get_string("threshold").empty())
            throw Error("decode-policy", "kvzap while decoding needs a threshold (--decode-param threshold=T)");
        const SegmentScorer::Threshold t{float(p.get_float("threshold")), p.get_int("window")};
        if (t.window < 0) throw Error("decode-policy", "the window cannot be negative");
        auto zap = std::make_shared<const Surrogate>(
            scorer_for(m, p.get_string("scorer"), Surrogate::kind_of(p.get_string("kind"))));
        return std::make_unique<KvzapSegments>(std::move(zap), m.hparams(), t);
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
