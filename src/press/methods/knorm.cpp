// Knorm (docs/methods.md): keep the keys with the lowest L2 norm (post-RoPE); a segment's scores
// come from its own keys, in the prefill and while decoding alike.
#include "kernels/scoring.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

std::vector<float> knorm_scores(const KvStore & cache, int il, int h) {
    return kernels::negative_key_norms(keys(cache, il, h).data(), cache.n_rows(il, h), cache.head_dim());
}

class KnormScorer : public Scorer {
public:
    explicit KnormScorer(const Model & m) : n_threads_(m.n_threads()) {}
    Scores score(const KvStore & cache) override { return score_segments(cache, n_threads_, knorm_scores); }

private:
    int n_threads_;
};

const MethodRegistrar reg([] {
    Registration r = uniform_method(
        MethodInfo{"knorm", "keeps the keys with the lowest L2 norm", {}, false, false},
        [](const Params &, const Model & m) -> std::unique_ptr<Scorer> { return std::make_unique<KnormScorer>(m); });
    r.segment = [](const ParamMap & params, const Model &) {
        refuse_decode_params("knorm", params);
        return stateless_segment_scorer(knorm_scores);
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
