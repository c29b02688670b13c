// CriticalKV (docs/methods.md), a wrapper on any scorer: per head, half the candidate budget
// goes to the top base scores; the rest to the top of (base score + eps) * ||W_o v||_1
// among the remaining rows, where ||W_o v_j||_1 is the L1 norm of value j projected by
// the output matrix of each query head of the group, averaged over the group.
#include <algorithm>
#include <cmath>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {

namespace {

constexpr float k_eps = 1e-4f;

class CriticalPress : public Press {
public:
    CriticalPress(std::unique_ptr<Scorer> base, const Model & m, bool kvpress_stages)
        : base_(std::move(base)), model_(m), kvpress_(kvpress_stages) {}
    const QueryObserver * observer(KvStore & cache, int64_t L) override {
        observe_s_ = 0.0;
        return base_->observer(cache, L, &observe_s_);
    }
    KeepPlan plan(const KvStore & cache, const Budget & budget) override {
        if (!cache.uniform()) throw Error("press", "criticalkv: the cache must be a freshly prefilled context");
        Scores s = base_->score(cache);
        const int64_t B = budget.per_layer(s.L);
        check_budget(s, B);
        if (B >= s.L) return select_per_layer_budget(s, std::vector<int64_t>(s.s.size(), B));
        const HParams & hp = model_.hparams();
        const int group = hp.n_gqa(), d = hp.head_dim;
        const int64_t n = B - s.forced();
        // stage 1: half the candidates (kvlab); or kvpress's int(0.5 (1 - cr) L) rows counting the
        // window (its padded scores put the window first), so the candidates get what it leaves
        const double keep = budget.keep_fraction(s.L);
        const int64_t first =
            kvpress_ ? std::clamp<int64_t>(std::max<int64_t>(1, int64_t(keep * double(s.L) * 0.5)) - s.forced(), 0, n)
                     : n / 2;
        // epsilon: kvpress adds it to the window MEAN, kvlab's window scores are sums over it
        const float eps = kvpress_ && s.window > 0 ? k_eps * float(s.window) : k_eps;
        KeepPlan plan(hp.n_layer, std::vector<std::vector<int32_t>>(hp.n_head_kv));
        parallel_for(hp.n_layer, model_.n_threads(), [&](int64_t il) {
            const std::vector<float> w = output_matrix(model_, int(il));
            const int64_t n_in = int64_t(hp.n_head) * d;
            // W_o's block of each query head, transposed to [head_dim][n_embd]
            std::vector<std::vector<float>> wt(hp.n_head, std::vector<float>(size_t(d) * hp.n_embd));
            for (int qh = 0; qh < hp.n_head; ++qh)
                for (int64_t r = 0; r < hp.n_embd; ++r)
                    for (int e = 0; e < d; ++e) wt[qh][size_t(e) * hp.n_embd + r] = w[r * n_in + int64_t(qh) * d + e];
            std::vector<float> out(static_cast<size_t>(hp.n_embd));
            for (int h = 0; h < hp.n_head_kv; ++h) {
                const std::vector<float> v = values(cache, int(il), h);
                std::vector<float> stage2(s.s[il][h]);
                for (int64_t j = 0; j < s.L; ++j) {
                    double norm = 0.0;
                    for (int g = 0; g < group; ++g) {
                        const std::vector<float> & t = wt[h * group + g];
                        std::fill(out.begin(), out.end(), 0.0f);
                        for (int e = 0; e < d; ++e) {
                            const float ve = v[size_t(j) * d + e];
                            const float * te = t.data() + size_t(e) * hp.n_embd;
                            for (int64_t r = 0; r < hp.n_embd; ++r) out[r] += ve * te[r];
                        }
                        for (float x : out) norm += std::fabs(x);
                    }
                    stage2[j] = (s.s[il][h][j] + eps) * float(norm / group);
                }
                std::vector<int32_t> keep = keep_rows(s, s.s[il][h], first);
                std::vector<char> taken(size_t(s.L), 0);
                for (int32_t j : keep) taken[j] = 1;
                std::vector<float> rest(static_cast<size_t>(s.L));
                for (int64_t j = 0; j < s.L; ++j) rest[j] = taken[j] ? -INFINITY : stage2[j];
                std::vector<int32_t> more = kernels::top_rows(rest.data(), s.L, n - first);
                keep.insert(keep.end(), more.begin(), more.end());
                std::sort(keep.begin(), keep.end());
                plan[il][h] = std::move(keep);
            }
        });
        return plan;
    }

private:
    std::unique_ptr<Scorer> base_;
    const Model & model_;
    bool kvpress_;
};

const MethodRegistrar reg([] {
    Registration r;
    r.info = {"criticalkv",
              "wrapper: half the budget by base score, half by base score x ||W_o v||_1",
              {{"stages",
                "kvlab",
                "kvlab: stage 1 is half the candidates, epsilon added to the window score; kvpress: stage 1 is "
                "int(0.5 (1 - cr) L) rows counting the window, epsilon added to the window mean",
                {"kvlab", "kvpress"}}},
              true,
              false};
    r.make = [](const Params & p, const Model & m) -> std::unique_ptr<Press> {
        return std::make_unique<CriticalPress>(make_base_scorer(p, m), m, p.get_string("stages") == "kvpress");
    };
    r.info.kvpress_params = kvpress_window_params({{"stages", "kvpress"}});
    r.info.defaults_differ =
        "stages=kvlab: stage 1 is half the candidates and epsilon is added to the window sum; kvpress: stage 1 is "
        "int(0.5 (1 - cr) L) rows counting the window, epsilon on the window mean";
    return r;
});

}  // namespace

}  // namespace kvlab::press
