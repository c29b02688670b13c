// PyramidKV (PRESSES.md): SnapKV's scores with per-layer budgets falling linearly from
// the first to the last layer (KVCache-Factory's floored step; the true total is reported).
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {
const MethodRegistrar reg([] {
    Registration r;
    auto params = window_params();
    params.push_back({"beta", "20", "the last layer keeps about (B - w) / beta rows besides the window"});
    r.info = {"pyramidkv", "SnapKV's scores; per-layer budgets falling linearly with depth", params, false, true};
    r.make = [](const Params & p, const Model & m) {
        const int64_t beta = p.get_int("beta");
        if (beta < 1) throw Error("press", "pyramidkv: beta must be at least 1");
        return scored_press(make_window_scorer(p, m), [beta](const Scores & s, const Budget & b, const KvStore &) {
            check_budget(s, b.per_layer(s.L));
            return select_per_layer_budget(s, pyramid_budgets(s.L, b.per_layer(s.L), s.window, int(s.s.size()), beta));
        });
    };
    r.info.kvpress_params = {{"window", "64"}, {"kernel", "5"}, {"pooling", "avg"}};
    r.info.kvpress_differs = "budgets: kvpress gives layer l window + L(1-cr) falling linearly (max_capacity_prompt), the window inside each layer's count, uniform when the smallest would be under the window; kvlab follows KVCache-Factory's beta formula";
    return r;
});
}  // namespace
}  // namespace kvlab::press
