// KeyDiff (docs/methods.md): keys least similar to the mean normalised key are kept
// (score = -cos(k_j, mean)); the first n_sink tokens are always kept. A segment's scores come
// from its own keys, in the prefill and while decoding alike.
#include "kernels/scoring.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

std::vector<float> keydiff_scores(const KvStore & cache, int il, int h) {
    return kernels::keydiff(keys(cache, il, h).data(), cache.n_rows(il, h), cache.head_dim());
}

class KeyDiffScorer : public Scorer {
public:
    KeyDiffScorer(int64_t n_sink, const Model & m) : n_sink_(n_sink), n_threads_(m.n_threads()) {}
    Scores score(const KvStore & cache) override {
        Scores s = score_segments(cache, n_threads_, keydiff_scores);
        s.n_sink = std::min(n_sink_, s.L);
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
    r.segment = [](const ParamMap & params, const Model &) {  // the policy's --decode-target sinks apply
        refuse_decode_params("keydiff", params);
        return stateless_segment_scorer(keydiff_scores);
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
