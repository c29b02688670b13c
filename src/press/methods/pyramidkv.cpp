// PyramidKV (docs/methods.md): SnapKV's scores with per-layer budgets falling linearly from
// the first to the last layer (KVCache-Factory's floored step; the true total is reported).
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {
const MethodRegistrar reg([] {
    Registration r;
    auto params = window_params();
    params.push_back({"beta", "20", "the last layer keeps about (B - w) / beta rows besides the window"});
    params.push_back({"budgets",
                      "factory",
                      "factory: KVCache-Factory's formula (the window on top of B, floored step); kvpress: "
                      "PyramidKVPress's (window + L(1-cr) falling linearly, the window inside, rounded)",
                      {"factory", "kvpress"}});
    r.info = {"pyramidkv", "SnapKV's scores; per-layer budgets falling linearly with depth", params, false, true};
    r.make = [](const Params & p, const Model & m) {
        const int64_t beta = p.get_int("beta");
        if (beta < 1) throw Error("press", "pyramidkv: beta must be at least 1");
        const std::string rule = p.get_string("budgets");
        return scored_press(make_window_scorer(p, m),
                            [beta, rule](const Scores & s, const Budget & b, const KvStore & cache) {
                                check_budget(s, b.per_layer(s.L));
                                // the schedule falls over the layers the budget compresses (on Gemma 3 the
                                // global ones, in depth order); the others keep everything here
                                const std::vector<int> layers = compressed_layers(cache, b);
                                const int n = int(layers.size());
                                std::vector<int64_t> sched;
                                if (rule == "kvpress") {
                                    const double keep = b.keep_fraction(s.L);
                                    sched = pyramid_budgets_kvpress(s.L, keep, s.window, n, beta);
                                } else {
                                    sched = pyramid_budgets(s.L, b.per_layer(s.L), s.window, n, beta);
                                }
                                std::vector<int64_t> B(s.s.size(), s.L);
                                for (int i = 0; i < n; ++i) B[size_t(layers[size_t(i)])] = sched[size_t(i)];
                                return select_per_layer_budget(s, B);
                            });
    };
    r.info.kvpress_params = kvpress_window_params({{"budgets", "kvpress"}});
    r.info.defaults_differ =
        "budgets=factory: KVCache-Factory's formula (PyramidKV's reference code), the window on top of each layer's "
        "share; kvpress: window + L(1-cr) falling linearly, the window inside, uniform when the smallest would be "
        "under the window; SnapKV's window defaults";
    return r;
});
}  // namespace
}  // namespace kvlab::press
