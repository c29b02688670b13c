// SnapKV (docs/methods.md): observation-window attention scores, pooled, uniform budget per
// layer, each KV head keeping its own rows. Also the window scorer of the SnapKV family.
#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"
#include "press/window_queries.h"

namespace kvlab::press {

namespace {

kernels::Pool parse_pool(const std::string & s) {  // one of the choices Params checked
    return s == "max" ? kernels::Pool::max : s == "avg" ? kernels::Pool::avg : kernels::Pool::none;
}

class WindowScorer : public Scorer {
public:
    WindowScorer(const Params & p, const Model & m) : hp_(m.hparams()), n_threads_(m.n_threads()) {
        w_ = p.get_int("window");
        kernel_ = int(p.get_int("kernel"));
        pool_ = parse_pool(p.get_string("pooling"));
        if (w_ < 1) throw Error("press", "window must be at least 1");
        if (kernel_ < 1 || kernel_ % 2 == 0) throw Error("press", "pooling kernel must be a positive odd number");
    }

    const QueryObserver * observer(KvStore &, int64_t L, double * observe_s) override {
        return window_.observe(hp_, w_, L, observe_s);
    }

    Scores score(const KvStore & cache) override {
        const int64_t L = cache.n_rows(0, 0);
        if (!window_.complete(L))
            throw Error("press", "window scorer: the context's queries were not observed during prefill");
        Scores s;
        s.L = L;
        s.window = window_.rows();
        s.s.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv, std::vector<float>(size_t(L), 0.0f)));
        const int group = hp_.n_gqa(), d = hp_.head_dim;
        parallel_for(int64_t(hp_.n_layer) * hp_.n_head_kv, n_threads_, [&](int64_t u) {
            const int il = int(u / hp_.n_head_kv), h = int(u % hp_.n_head_kv);
            const std::vector<float> k = keys(cache, il, h);
            const std::vector<float> sc = kernels::pool1d(
                kernels::window_attention(window_.layer(il) + size_t(h) * group * d, int64_t(hp_.n_head) * d, k.data(),
                                          L, int(window_.rows()), group, d),
                kernel_, pool_);
            std::copy(sc.begin(), sc.end(), s.s[il][h].begin());
        });
        return s;
    }

private:
    HParams hp_;
    int n_threads_;
    int64_t w_ = 32;
    int kernel_ = 7;
    kernels::Pool pool_ = kernels::Pool::max;
    WindowQueries window_;
};

}  // namespace

std::unique_ptr<Scorer> make_window_scorer(const Params & p, const Model & m) {
    return std::make_unique<WindowScorer>(p, m);
}

namespace {
const MethodRegistrar reg([] {
    Registration r =
        uniform_method(MethodInfo{"snapkv", "observation-window attention, pooled; the same budget for every layer",
                                  window_params(), false, true},
                       make_window_scorer);
    r.info.kvpress_params = kvpress_window_params();
    r.info.defaults_differ =
        "w=32, k=7 and max pooling, as SnapKV's reference code; kvpress uses w=64, k=5, avg pooling and averages the "
        "window rows";
    return r;
});
}  // namespace

}  // namespace kvlab::press
