// Knorm (docs/methods.md): keep the keys with the lowest L2 norm (post-RoPE).
#include "kernels/scoring.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class KnormScorer : public Scorer {
public:
    explicit KnormScorer(const Model & m) : n_threads_(m.n_threads()) {}
    Scores score(const KvStore & cache) override {
        Scores s;
        s.L = cache.n_rows(0, 0);
        s.s.assign(cache.n_layer(), std::vector<std::vector<float>>(cache.n_head_kv()));
        parallel_for(int64_t(cache.n_layer()) * cache.n_head_kv(), n_threads_, [&](int64_t u) {
            const int il = int(u / cache.n_head_kv()), h = int(u % cache.n_head_kv());
            s.s[il][h] = kernels::negative_key_norms(keys(cache, il, h).data(), s.L, cache.head_dim());
        });
        return s;
    }

private:
    int n_threads_;
};

std::unique_ptr<Scorer> make_scorer(const Params &, const Model & m) {
    return std::make_unique<KnormScorer>(m);
}

const MethodRegistrar reg([] {
    Registration r =
        uniform_method(MethodInfo{"knorm", "keeps the keys with the lowest L2 norm", {}, false, false}, make_scorer);
    return r;
});

}  // namespace
}  // namespace kvlab::press
