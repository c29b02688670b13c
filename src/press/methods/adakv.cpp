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
        return scored_press(make_base_scorer(p, m), adakv_policy(alpha, kvpress));
    };
    r.info.kvpress_params = kvpress_window_params({{"allocation", "kvpress"}});
    r.info.defaults_differ =
        "allocation=adakv: the Ada-KV paper's b_h = round(n_h (1 - alpha) + floor(alpha b)) over the candidates; "
        "kvpress counts the window inside n_kept and protects each head's top int(alpha n_kept) before the global "
        "bottom is evicted";
    return r;
});
}  // namespace
}  // namespace kvlab::press
