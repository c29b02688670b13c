// Random (docs/methods.md): uniform random scores from a seeded generator, per layer and head:
// the floor any method must beat.
#include <random>

#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class RandomScorer : public Scorer {
public:
    explicit RandomScorer(uint64_t seed) : seed_(seed) {}
    Scores score(const KvStore & cache) override {
        Scores s;
        s.L = cache.n_rows(0, 0);
        s.s.assign(cache.n_layer(),
                   std::vector<std::vector<float>>(cache.n_head_kv(), std::vector<float>(static_cast<size_t>(s.L))));
        for (int il = 0; il < cache.n_layer(); ++il)
            for (int h = 0; h < cache.n_head_kv(); ++h) {
                std::seed_seq sq{uint32_t(seed_), uint32_t(seed_ >> 32), uint32_t(il), uint32_t(h)};
                std::mt19937_64 rng(sq);
                std::uniform_real_distribution<float> u(0.0f, 1.0f);
                for (float & x : s.s[il][h]) x = u(rng);
            }
        return s;
    }

private:
    uint64_t seed_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model &) {
    return std::make_unique<RandomScorer>(uint64_t(p.get_int("seed")));
}

const MethodRegistrar reg([] {
    Registration r = uniform_method(MethodInfo{"random",
                                               "uniform random scores (seeded): the floor every method must beat",
                                               {{"seed", "0", "seed of the generator (per layer and head streams)"}},
                                               false,
                                               false},
                                    make_scorer);
    r.info.kvpress_differs = "kvpress draws its scores from torch's generator: the same rule, other rows";
    return r;
});

}  // namespace
}  // namespace kvlab::press
