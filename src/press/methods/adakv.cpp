// Ada-KV (docs/methods.md), a wrapper on any scorer: per layer, the heads share the budget by
// a global ranking of their scores, with the safeguard alpha; each head keeps its own
// top b_h plus the forced rows. Heads end up with different lengths and the store frees
// the rest for real.
#include <algorithm>

#include "kvlab/error.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {
const MethodRegistrar reg([] {
    Registration r;
    r.info = {"adakv",
              "wrapper: per-head budgets from a global ranking of the base scores, with a safeguard",
              {{"alpha", "0.2", "safeguard: every head keeps at least floor(alpha * b) rows"},
               {"allocation",
                "adakv",
                "adakv: the paper's rule, b_h = round(n_h (1 - alpha) + floor(alpha b)) over the candidates; kvpress: "
                "each head's top max(1, int(alpha n_kept)) rows counting the window, then the global top",
                {"adakv", "kvpress"}}},
              true,
              false};
    r.make = [](const Params & p, const Model & m) {
        const double alpha = p.get_float("alpha");
        if (!(alpha >= 0.0 && alpha <= 1.0)) throw Error("press", "adakv: alpha must lie in [0, 1]");
        const bool kvpress = p.get_string("allocation") == "kvpress";
        return scored_press(
            make_base_scorer(p, m), [alpha, kvpress](const Scores & s, const Budget & b, const KvStore &) {
                const int64_t B = b.per_layer(s.L);
                check_budget(s, B);
                std::vector<std::vector<int64_t>> n(s.s.size());
                for (size_t il = 0; il < s.s.size(); ++il) {
                    const int64_t cand = s.L - s.forced();
                    const int64_t bc = std::min(cand, B - s.forced());
                    std::vector<std::vector<float>> cs;
                    for (size_t h = 0; h < s.s[il].size(); ++h) cs.push_back(candidate_scores(s, int(il), int(h)));
                    if (kvpress) {
                        const int64_t n_safe = alpha > 0.0 ? std::max<int64_t>(1, int64_t(double(B) * alpha)) : 0;
                        n[il] = adakv_head_budgets_kvpress(cs, bc, std::max<int64_t>(0, n_safe - s.forced()));
                    } else {
                        n[il] = adakv_head_budgets(cs, bc, alpha);
                    }
                }
                return select_per_head(s, n);
            });
    };
    r.info.kvpress_params = {{"window", "64"}, {"kernel", "5"}, {"pooling", "avg"}, {"allocation", "kvpress"}};
    r.info.defaults_differ =
        "allocation=adakv: the Ada-KV paper's b_h = round(n_h (1 - alpha) + floor(alpha b)) over the candidates; "
        "kvpress counts the window inside n_kept and protects each head's top int(alpha n_kept) before the global "
        "bottom is evicted";
    return r;
});
}  // namespace
}  // namespace kvlab::press
