// H2O (docs/methods.md): column sums of the full causal prefill attention (every query row,
// each key counted only by the queries that see it), accumulated chunk by chunk during
// prefill; keeps the heavy hitters plus a recent window (heavy = recent by default).
#include <cmath>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class ColumnSumScorer : public Scorer {
public:
    ColumnSumScorer(const Params & p, const Model & m) : hp_(m.hparams()), n_threads_(m.n_threads()) {
        normalize_ = p.get_bool("normalize");
    }

    const QueryObserver * observer(KvStore & cache, int64_t L, double * observe_s) override {
        if (cache.next_pos() != 0) throw Error("press", "h2o: the context must be prefilled into an empty cache");
        L_ = L;
        seen_ = 0;
        col_.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv, std::vector<float>(size_t(L), 0.0f)));
        obs_.first = 0;
        obs_.on_queries = [this, &cache, observe_s](int il, int64_t tok0, int64_t n, const float * q) {
            const double t0 = now_seconds();
            const int group = hp_.n_gqa(), d = hp_.head_dim, H = hp_.n_head_kv;
            const int parts = std::max(1, n_threads_);
            // (head, part of the chunk's rows) jobs with private sums, added in a fixed order
            std::vector<std::vector<float>> partial(size_t(H) * parts);
            std::vector<std::vector<float>> k(H);
            for (int h = 0; h < H; ++h) k[h] = keys(cache, il, h);
            parallel_for(int64_t(H) * parts, n_threads_, [&](int64_t u) {
                const int h = int(u / parts), part = int(u % parts);
                // balance the causal triangle: later rows see more keys
                auto bound = [&](int i) {
                    const double a = double(tok0), b = double(tok0 + n);
                    return int64_t(std::llround(std::sqrt(a * a + (b * b - a * a) * i / parts))) - tok0;
                };
                const int64_t r0 = std::clamp<int64_t>(bound(part), 0, n),
                              r1 = std::clamp<int64_t>(bound(part + 1), 0, n);
                auto & acc = partial[u];
                acc.assign(size_t(tok0 + n), 0.0f);
                if (r1 > r0)
                    kernels::accumulate_column_sums(q + r0 * hp_.n_head * d + h * group * d, int64_t(hp_.n_head) * d,
                                                    r1 - r0, tok0 + r0, k[h].data(), group, d, acc.data());
            });
            for (int h = 0; h < H; ++h)
                for (int part = 0; part < parts; ++part) {
                    const auto & acc = partial[size_t(h) * parts + part];
                    for (size_t j = 0; j < acc.size(); ++j) col_[il][h][j] += acc[j];
                }
            if (il == 0) seen_ += n;
            *observe_s += now_seconds() - t0;
        };
        return &obs_;
    }

    Scores score(const KvStore & cache) override {
        const int64_t L = cache.n_rows(0, 0);
        if (col_.empty() || L != L_ || seen_ != L)
            throw Error("press",
                        "h2o: the whole prefill must be observed (prefill the context with the method's observer)");
        Scores s;
        s.L = L;
        s.s = col_;
        if (normalize_)  // kvpress's ObservedAttention: divide by the number of queries that see each key
            for (auto & layer : s.s)
                for (auto & head : layer)
                    for (int64_t j = 0; j < L; ++j) head[j] /= float(L - j);
        return s;
    }

private:
    HParams hp_;
    int n_threads_;
    bool normalize_ = false;
    int64_t L_ = 0, seen_ = 0;
    std::vector<std::vector<std::vector<float>>> col_;
    QueryObserver obs_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model & m) {
    return std::make_unique<ColumnSumScorer>(p, m);
}

const MethodRegistrar reg([] {
    Registration r;
    r.info = {"h2o",
              "heavy hitters by column sums of the whole causal prefill attention, plus recent tokens",
              {{"recent", "0.5", "fraction of the budget given to the most recent tokens"},
               {"normalize", "false", "divide each key's sum by the number of queries that see it (kvpress)"}},
              false,
              true};
    r.scorer = make_scorer;
    r.make = [](const Params & p, const Model & m) {
        const double recent = p.get_float("recent");
        if (!(recent >= 0.0 && recent <= 1.0)) throw Error("press", "h2o: recent must lie in [0, 1]");
        return scored_press(make_scorer(p, m), [recent](const Scores & s0, const Budget & b, const KvStore &) {
            Scores s = s0;
            const int64_t B = b.per_layer(s.L);
            s.window = std::min<int64_t>(s.L, int64_t(std::floor(double(B) * recent)));
            return select_per_layer_budget(s, std::vector<int64_t>(s.s.size(), B));
        });
    };
    r.info.kvpress_params = {{"normalize", "true"}, {"recent", "0"}};
    r.info.defaults_differ =
        "recent=0.5 and raw column sums: H2O's heavy hitters plus a recent window; kvpress's ObservedAttention divides "
        "each sum by the queries that see the key and keeps no recent window";
    return r;
});

}  // namespace
}  // namespace kvlab::press
