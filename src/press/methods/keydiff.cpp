// KeyDiff (docs/methods.md): keys least similar to the mean normalised key are kept
// (score = -cos(k_j, mean)); the first n_sink tokens are always kept.
#include "kernels/scoring.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class KeyDiffScorer : public Scorer {
public:
    KeyDiffScorer(int64_t n_sink, const Model & m) : n_sink_(n_sink), n_threads_(m.n_threads()) {}
    Scores score(const KvStore & cache) override {
        Scores s;
        s.L = cache.n_rows(0, 0);
        s.n_sink = std::min(n_sink_, s.L);
        s.s.assign(cache.n_layer(), std::vector<std::vector<float>>(cache.n_head_kv()));
        parallel_for(int64_t(cache.n_layer()) * cache.n_head_kv(), n_threads_, [&](int64_t u) {
            const int il = int(u / cache.n_head_kv()), h = int(u % cache.n_head_kv());
            s.s[il][h] = kernels::keydiff(keys(cache, il, h).data(), s.L, cache.head_dim());
        });
        return s;
    }

private:
    int64_t n_sink_;
    int n_threads_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model & m) {
    const int64_t n_sink = p.get_int("n_sink");
    if (n_sink < 0) throw Error("press", "keydiff: n_sink must be non-negative");
    return std::make_unique<KeyDiffScorer>(n_sink, m);
}

const MethodRegistrar reg([] {
    Registration r =
        uniform_method(MethodInfo{"keydiff",
                                  "keeps the keys least similar to the mean key direction (-cosine), plus sinks",
                                  {{"n_sink", "4", "first tokens always kept"}},
                                  false,
                                  false},
                       make_scorer);
    r.info.kvpress_params = {{"n_sink", "0"}};
    r.info.defaults_differ = "keeps 4 sinks; kvpress keeps none";
    return r;
});

}  // namespace
}  // namespace kvlab::press
