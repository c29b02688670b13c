// StreamingLLM (docs/methods.md): the first n_sink tokens and the most recent B - n_sink; a row's
// score is its position, in the prefill and while decoding alike.
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

std::vector<float> recency(const KvStore & cache, int il, int h) {
    const std::vector<int32_t> & pos = cache.positions(il, h);
    return std::vector<float>(pos.begin(), pos.end());
}

class RecencyScorer : public Scorer {
public:
    explicit RecencyScorer(int64_t n_sink) : n_sink_(n_sink) {}
    Scores score(const KvStore & cache) override {
        Scores s = score_segments(cache, 1, recency);
        s.n_sink = std::min(n_sink_, s.L);
        s.per_layer = true;
        return s;
    }

private:
    int64_t n_sink_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model &) {
    const int64_t n_sink = p.get_int("n_sink");
    if (n_sink < 0) throw Error("press", "streaming_llm: n_sink must be non-negative");
    return std::make_unique<RecencyScorer>(n_sink);
}

const MethodRegistrar reg([] {
    Registration r = uniform_method({"streaming_llm",
                                     "attention sinks plus the most recent tokens",
                                     {{"n_sink", "4", "first tokens always kept (attention sinks)"}},
                                     false,
                                     false},
                                    make_scorer);
    r.segment = [](const ParamMap & params, const Model &) {
        refuse_decode_params("streaming_llm", params);
        return stateless_segment_scorer(recency);
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
