// StreamingLLM (docs/methods.md): the first n_sink tokens and the most recent B - n_sink.
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class RecencyScorer : public Scorer {
public:
    explicit RecencyScorer(int64_t n_sink) : n_sink_(n_sink) {}
    Scores score(const KvStore & cache) override {
        Scores s;
        s.L = cache.n_rows(0, 0);
        s.n_sink = std::min(n_sink_, s.L);
        s.per_layer = true;
        std::vector<float> recency(static_cast<size_t>(s.L));
        for (int64_t j = 0; j < s.L; ++j) recency[j] = float(j);
        s.s.assign(cache.n_layer(), std::vector<std::vector<float>>(cache.n_head_kv(), recency));
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
    return uniform_method({"streaming_llm",
                           "attention sinks plus the most recent tokens",
                           {{"n_sink", "4", "first tokens always kept (attention sinks)"}},
                           false,
                           false},
                          make_scorer);
});

}  // namespace
}  // namespace kvlab::press
