// kvlab's sample_token (src/engine/sampling.cpp) against libllama's sampler chain on fixed logits:
// a hand-picked vocabulary of 12 tokens, variants of it with -inf and tied logits, and a seeded
// random one of 40 tokens.
// - Greedy (temp 0, whatever top-k and top-p say): exactly the token of libllama's greedy sampler
//   (the argmax, lowest id on ties).
// - Temperature, top-k, top-p: the two draw their random numbers differently, so the comparison is
//   of distributions. libllama's chain top_k -> temp -> top_p is applied without its final dist
//   sampler (llama_sampler_apply on a llama_token_data_array); the probability of each token is the
//   softmax over the (tempered) logits of the candidates it leaves. kvlab draws 20000 tokens from a
//   seeded std::mt19937_64: it must never draw a token the chain gives probability 0, must draw
//   every token the chain gives p >= 1e-3 (missed in 20000 draws with probability
//   (1 - p)^20000 <= e^-20), and each token's frequency must be within 5 binomial sigma (+ 1e-3) of
//   the chain's probability.
// - The same seed gives the same tokens; edge cases: top_k beyond the vocabulary, top_p = 1, ties,
//   -inf logits.
//
// Order: kvlab applies top-p to the TEMPERED distribution (engine.h: "temperature, top-k and top-p";
// temperature and top-k commute), so libllama's chain is built top_k -> temp -> top_p. llama-server's
// default order (common/common.h: ... top_k, typical_p, top_p, min_p, xtc, temperature) applies
// temperature last, i.e. top-p to the untempered distribution. Several cases are chosen where the two
// orders keep different tokens (checked), so a change of kvlab's order fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kvlab/engine.h"
#include "llama-cpp.h"
#include "llama.h"

namespace kvlab {
namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();
constexpr int k_draws = 20000;

// 12 tokens, distinct logits (multiples of 1/4), probabilities from ~0.002 to ~0.3 at temperature 1
const std::vector<float> k_hand = {2.0f, 0.5f, 3.0f, -1.0f, 1.5f, 2.5f, 0.0f, -0.5f, 1.0f, 2.75f, -2.0f, 0.25f};

// k_hand with tokens 3, 7 and 10 at -inf
std::vector<float> hand_with_inf() {
    std::vector<float> x = k_hand;
    x[3] = x[7] = x[10] = -k_inf;
    return x;
}

// Three tokens tied at the top (1, 2, 4), two pairs tied below ({0, 7} at 1.0, {3, 6} at 0.5).
const std::vector<float> k_ties = {1.0f, 2.0f, 2.0f, 0.5f, 2.0f, -1.0f, 0.5f, 1.0f};

// n logits in [-4, 4], multiples of 1/1024, from the raw output of std::mt19937_64 (the same with
// every standard library, unlike std::normal_distribution); seed 2718, n 40: no two equal.
std::vector<float> random_logits(uint64_t seed, int n) {
    std::mt19937_64 rng(seed);
    std::vector<float> x(static_cast<size_t>(n));
    for (float & v : x) v = float(int64_t(rng() % 8193) - 4096) / 1024.0f;
    return x;
}

std::string describe(const SamplingParams & sp) {
    std::ostringstream s;
    s << "temp " << sp.temp << ", top_k " << sp.top_k << ", top_p " << sp.top_p;
    return s.str();
}

std::vector<llama_token_data> candidates(const std::vector<float> & logits) {
    std::vector<llama_token_data> c;
    for (size_t i = 0; i < logits.size(); ++i) c.push_back({llama_token(i), logits[i], 0.0f});
    return c;
}

// The token of libllama's greedy sampler.
int32_t llama_greedy(const std::vector<float> & logits) {
    llama_sampler_ptr greedy(llama_sampler_init_greedy());
    std::vector<llama_token_data> c = candidates(logits);
    llama_token_data_array arr = {c.data(), c.size(), -1, false};
    llama_sampler_apply(greedy.get(), &arr);
    return arr.data[arr.selected].id;
}

enum class Order {
    kvlab,   // top_k -> temp -> top_p: top-p over the tempered distribution (sample_token's order)
    server,  // top_k -> top_p -> temp: llama-server's default order (temperature last)
};

// libllama's chain on the logits without its final dist sampler: the probability it gives each
// token ([n_vocab]; 0 for the tokens it removed), the softmax over the logits of those it leaves
// (divided by the temperature by its temp sampler). top_k <= 0 and top_p >= 1 are no-ops there.
std::vector<double> chain_probs(const std::vector<float> & logits, const SamplingParams & sp,
                                Order order = Order::kvlab) {
    llama_sampler_ptr chain(llama_sampler_chain_init(llama_sampler_chain_default_params()));
    llama_sampler_chain_add(chain.get(), llama_sampler_init_top_k(sp.top_k));
    if (order == Order::kvlab) {
        llama_sampler_chain_add(chain.get(), llama_sampler_init_temp(sp.temp));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_top_p(sp.top_p, 1));
    } else {
        llama_sampler_chain_add(chain.get(), llama_sampler_init_top_p(sp.top_p, 1));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_temp(sp.temp));
    }
    std::vector<llama_token_data> c = candidates(logits);
    llama_token_data_array arr = {c.data(), c.size(), -1, false};
    llama_sampler_apply(chain.get(), &arr);
    double mx = -INFINITY;
    for (size_t j = 0; j < arr.size; ++j) mx = std::max(mx, double(arr.data[j].logit));
    double z = 0.0;
    for (size_t j = 0; j < arr.size; ++j) z += std::exp(double(arr.data[j].logit) - mx);
    std::vector<double> p(logits.size(), 0.0);
    for (size_t j = 0; j < arr.size; ++j) p[size_t(arr.data[j].id)] += std::exp(double(arr.data[j].logit) - mx) / z;
    return p;
}

std::set<int32_t> support(const std::vector<double> & p) {
    std::set<int32_t> s;
    for (size_t i = 0; i < p.size(); ++i)
        if (p[i] > 0.0) s.insert(int32_t(i));
    return s;
}

// Whether a case compares kvlab (double arithmetic) with libllama (float) on what both define:
// no finite tie at the top-k boundary (which of tied tokens libllama's top-k keeps is unspecified)
// and no running sum of the sorted, tempered top-k probabilities within 1e-4 of top_p (where float
// and double may cut differently; the sums differ by ~1e-6).
::testing::AssertionResult well_posed(const std::vector<float> & logits, const SamplingParams & sp) {
    std::vector<float> s = logits;
    std::sort(s.begin(), s.end(), std::greater<float>());
    const size_t n = s.size();
    const size_t k = sp.top_k > 0 ? std::min(size_t(sp.top_k), n) : n;
    if (k < n && s[k - 1] == s[k] && std::isfinite(s[k]))
        return ::testing::AssertionFailure() << "a tie at the top-k boundary: " << s[k];
    if (sp.top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (size_t i = 0; i < k; ++i) z += std::exp((double(s[i]) - s[0]) / sp.temp);
        for (size_t i = 0; i < k; ++i) {
            cum += std::exp((double(s[i]) - s[0]) / sp.temp) / z;
            if (std::abs(cum - sp.top_p) < 1e-4)
                return ::testing::AssertionFailure() << "top_p within 1e-4 of the running sum " << cum;
        }
    }
    return ::testing::AssertionSuccess();
}

// How many times kvlab draws each token in k_draws draws from mt19937_64(seed).
std::vector<int64_t> draw_counts(const std::vector<float> & logits, const SamplingParams & sp, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> counts(logits.size(), 0);
    for (int i = 0; i < k_draws; ++i) {
        const int32_t t = sample_token(logits, sp, rng);
        if (t < 0 || size_t(t) >= logits.size()) {
            ADD_FAILURE() << "token " << t << " outside the vocabulary of " << logits.size();
            break;
        }
        ++counts[size_t(t)];
    }
    return counts;
}

// kvlab's frequencies against the probabilities p (libllama's chain). The count of a token of
// probability p_i in N = k_draws independent draws is Binomial(N, p_i): its frequency has standard
// deviation sigma_i = sqrt(p_i (1 - p_i) / N) (<= 0.0036 at N = 20000). A frequency may differ by
// 5 sigma_i + 1e-3: a normal deviate beyond 5 sigma has probability 5.7e-7, below 1e-3 over the
// few hundred comparisons of this file (and the seeds are fixed, so the outcome never changes);
// the 1e-3 floor (20 draws) covers the skew of the binomial where N p_i is a few draws and the
// float vs double probabilities (~1e-6). A wrong temperature, cut or order moves probabilities
// by far more (see the cases).
void expect_frequencies(const std::vector<int64_t> & counts, const std::vector<double> & p) {
    for (size_t i = 0; i < p.size(); ++i) {
        const double f = double(counts[i]) / k_draws;
        if (p[i] == 0.0) {
            EXPECT_EQ(counts[i], 0) << "token " << i << " is outside libllama's support";
            continue;
        }
        if (p[i] >= 1e-3) {
            EXPECT_GT(counts[i], 0) << "token " << i << " of probability " << p[i] << " never drawn";
        }
        const double sigma = std::sqrt(p[i] * (1.0 - p[i]) / k_draws);
        EXPECT_LE(std::abs(f - p[i]), 5.0 * sigma + 1e-3)
            << "token " << i << ": frequency " << f << ", libllama's chain " << p[i];
    }
}

// The whole comparison of one case (see the file's comment).
void expect_same_distribution(const std::vector<float> & logits, const SamplingParams & sp, uint64_t seed = 1) {
    SCOPED_TRACE(describe(sp));
    ASSERT_TRUE(well_posed(logits, sp));
    const std::vector<double> p = chain_probs(logits, sp);
    expect_frequencies(draw_counts(logits, sp, seed), p);
}

struct Case {
    SamplingParams sp;
    bool orders_differ;  // llama-server's order keeps other tokens (checked: the case pins kvlab's order)
};

void run_cases(const std::vector<float> & logits, const std::vector<Case> & cases) {
    for (const Case & c : cases) {
        expect_same_distribution(logits, c.sp);
        const bool differ =
            support(chain_probs(logits, c.sp, Order::kvlab)) != support(chain_probs(logits, c.sp, Order::server));
        EXPECT_EQ(differ, c.orders_differ) << describe(c.sp) << ": the case no longer tells the orders apart";
    }
}

SamplingParams params(float temp, int32_t top_k, float top_p) {
    SamplingParams sp;
    sp.temp = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    return sp;
}

TEST(SampleToken, ReferenceIsWhatLibllamasDistSamplerDraws) {
    // The reference read off the chain without dist (softmax over the candidates it leaves) is the
    // distribution libllama itself draws from with dist at the end of the chain.
    for (const SamplingParams & sp : {params(1.0f, 0, 1.0f), params(0.5f, 6, 0.9f), params(2.0f, 0, 0.75f)}) {
        SCOPED_TRACE(describe(sp));
        llama_sampler_ptr chain(llama_sampler_chain_init(llama_sampler_chain_default_params()));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_top_k(sp.top_k));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_temp(sp.temp));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_top_p(sp.top_p, 1));
        llama_sampler_chain_add(chain.get(), llama_sampler_init_dist(1234));
        std::vector<int64_t> counts(k_hand.size(), 0);
        for (int i = 0; i < k_draws; ++i) {
            std::vector<llama_token_data> c = candidates(k_hand);
            llama_token_data_array arr = {c.data(), c.size(), -1, false};
            llama_sampler_apply(chain.get(), &arr);
            ASSERT_GE(arr.selected, 0);
            ASSERT_LT(size_t(arr.selected), arr.size);
            ++counts[size_t(arr.data[arr.selected].id)];
        }
        expect_frequencies(counts, chain_probs(k_hand, sp));
    }
}

TEST(SampleToken, GreedyIsLibllamaGreedy) {
    // temp 0 is greedy: the argmax, lowest id on ties, whatever top-k, top-p and the random state
    const std::vector<std::pair<std::vector<float>, int32_t>> cases = {
        {k_hand, 2},
        {random_logits(2718, 40), 16},
        {k_ties, 1},                        // 1, 2 and 4 tied
        {{-k_inf, 1.0f, -k_inf, 1.0f}, 1},  // -inf logits, a tie
        {{0.5f, 0.5f, 0.5f, 0.5f}, 0},      // all equal
    };
    std::mt19937_64 rng(7);
    for (const auto & [logits, want] : cases) {
        EXPECT_EQ(llama_greedy(logits), want);
        for (const SamplingParams & sp : {params(0.0f, 0, 1.0f), params(0.0f, 3, 0.5f)})
            for (int i = 0; i < 100; ++i) ASSERT_EQ(sample_token(logits, sp, rng), want) << describe(sp);
    }
}

TEST(SampleToken, TemperatureTopKTopPMatchLibllamasChainOnHandPickedLogits) {
    run_cases(k_hand, {
                          {params(1.0f, 0, 1.0f), false},   // plain softmax, every token
                          {params(0.7f, 5, 1.0f), false},   // top-k only
                          {params(1.3f, 0, 0.8f), true},    // top-p keeps 5 tokens (4 untempered)
                          {params(0.5f, 6, 0.9f), true},    // top-k 6, then top-p keeps 3 (5 untempered)
                          {params(0.5f, 0, 0.6f), true},    // 2 tokens (3 untempered)
                          {params(2.0f, 0, 0.75f), true},   // 6 tokens (4 untempered)
                          {params(0.25f, 3, 1.0f), false},  // sharp: a wrong temperature shows
                      });
}

TEST(SampleToken, TemperatureTopKTopPMatchLibllamasChainOnRandomLogits) {
    run_cases(random_logits(2718, 40), {
                                           {params(1.0f, 10, 0.95f), false},  // top-k 10, top-p keeps 9
                                           {params(0.8f, 0, 0.7f), true},     // 4 tokens (6 untempered)
                                           {params(2.0f, 25, 0.9f), true},    // 18 tokens (11 untempered)
                                           {params(1.5f, 0, 1.0f), false},    // all 40
                                           {params(0.6f, 30, 0.5f), true},    // only the argmax (3 untempered)
                                           {params(1.0f, 0, 1.0f), false},    // all 40, 13 below p = 1e-3
                                       });
}

TEST(SampleToken, TopKBeyondTheVocabularyAndTopPOneAreOff) {
    // top_k >= the vocabulary keeps every token and top_p = 1 cuts nothing (both off): all 12 drawn
    for (int32_t k : {12, 13, 1000}) {
        expect_same_distribution(k_hand, params(1.0f, k, 1.0f));
        EXPECT_EQ(support(chain_probs(k_hand, params(1.0f, k, 1.0f))).size(), 12u);
    }
    expect_same_distribution(k_hand, params(0.8f, 1000, 1.0f));
    // top_k 1: the argmax at any temperature
    std::mt19937_64 rng(3);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(sample_token(k_hand, params(5.0f, 1, 1.0f), rng), 2);
}

TEST(SampleToken, NegativeInfinityLogitsAreNeverDrawn) {
    const std::vector<float> x = hand_with_inf();
    run_cases(x, {
                     {params(1.0f, 0, 1.0f), false},
                     {params(1.0f, 1000, 1.0f), false},
                     {params(0.9f, 11, 0.95f), true},  // top-k keeps 2 of the -inf tokens
                     {params(0.7f, 0, 0.9f), true},
                 });
    // one finite logit: always drawn, whatever the temperature
    std::mt19937_64 rng(5);
    for (const SamplingParams & sp : {params(1.0f, 0, 1.0f), params(3.0f, 3, 0.9f)})
        for (int i = 0; i < 1000; ++i) ASSERT_EQ(sample_token({-k_inf, -k_inf, 0.5f, -k_inf}, sp, rng), 2);
}

TEST(SampleToken, TiedLogitsAreDrawnEqually) {
    expect_same_distribution(k_ties, params(1.0f, 0, 1.0f));
    expect_same_distribution(k_ties, params(0.5f, 0, 1.0f));
    // top_k 4 cuts between tokens 0 and 7 (both 1.0): both keep exactly one of them (which one is
    // not specified), so the distributions are compared over logit values
    const SamplingParams sp = params(1.0f, 4, 1.0f);
    const std::vector<double> p = chain_probs(k_ties, sp);
    const std::vector<int64_t> counts = draw_counts(k_ties, sp, 11);
    std::set<int32_t> drawn;
    std::vector<double> p_by_logit, f_by_logit;  // [0]: logit 2.0, [1]: logit 1.0
    p_by_logit.assign(2, 0.0);
    f_by_logit.assign(2, 0.0);
    for (size_t i = 0; i < k_ties.size(); ++i) {
        if (counts[i] > 0) drawn.insert(int32_t(i));
        const int slot = k_ties[i] == 2.0f ? 0 : k_ties[i] == 1.0f ? 1 : -1;
        if (slot < 0) {
            EXPECT_EQ(p[i], 0.0) << "token " << i;
            EXPECT_EQ(counts[i], 0) << "token " << i;
            continue;
        }
        p_by_logit[size_t(slot)] += p[i];
        f_by_logit[size_t(slot)] += double(counts[i]) / k_draws;
    }
    EXPECT_EQ(support(p).size(), 4u);
    EXPECT_EQ(drawn.size(), 4u);
    EXPECT_TRUE(drawn.count(1) && drawn.count(2) && drawn.count(4));
    for (size_t slot = 0; slot < 2; ++slot) {
        const double sigma = std::sqrt(p_by_logit[slot] * (1.0 - p_by_logit[slot]) / k_draws);
        EXPECT_LE(std::abs(f_by_logit[slot] - p_by_logit[slot]), 5.0 * sigma + 1e-3) << "logit slot " << slot;
    }
}

TEST(SampleToken, TheSameSeedGivesTheSameTokens) {
    const std::vector<float> logits = random_logits(2718, 40);
    SamplingParams sp = params(0.8f, 20, 0.9f);
    sp.seed = 42;
    auto tokens = [&](uint64_t seed) {
        std::mt19937_64 rng(seed);
        std::vector<int32_t> t;
        for (int i = 0; i < 1000; ++i) t.push_back(sample_token(logits, sp, rng));
        return t;
    };
    const std::vector<int32_t> a = tokens(sp.seed);
    EXPECT_EQ(tokens(sp.seed), a);
    EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 1u);  // not one token over and over
    EXPECT_NE(tokens(sp.seed + 1), a);                            // and the seed matters
}

}  // namespace
}  // namespace kvlab
