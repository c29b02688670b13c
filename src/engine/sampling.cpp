#include <algorithm>
#include <cmath>
#include <numeric>

#include "kvlab/engine.h"

namespace kvlab {

float log_sum_exp(const std::vector<float> & x) {
    const float mx = *std::max_element(x.begin(), x.end());
    double sum = 0.0;
    for (float v : x) sum += std::exp(double(v - mx));
    return mx + float(std::log(sum));
}

void log_softmax(std::vector<float> & x) {
    const float lse = log_sum_exp(x);
    for (float & v : x) v -= lse;
}

int32_t sample_token(const std::vector<float> & logits, const SamplingParams & p, std::mt19937_64 & rng) {
    const int32_t n = int32_t(logits.size());
    if (p.temp <= 0.0f) {
        // greedy; ties go to the lowest id (as llama.cpp's argmax)
        return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    std::vector<int32_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    int32_t keep = n;
    if (p.top_k > 0 && p.top_k < n) {
        keep = p.top_k;
        std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
    } else {
        std::sort(ids.begin(), ids.end(), by_logit);
    }
    std::vector<double> probs(keep);
    const double mx = logits[ids[0]];
    double sum = 0.0;
    for (int32_t i = 0; i < keep; ++i) sum += probs[i] = std::exp((logits[ids[i]] - mx) / p.temp);
    if (p.top_p < 1.0f) {
        double cum = 0.0;
        int32_t cut = keep;
        for (int32_t i = 0; i < keep; ++i) {
            cum += probs[i] / sum;
            if (cum >= p.top_p) {
                cut = i + 1;
                break;
            }
        }
        keep = cut;
        probs.resize(keep);
    }
    std::discrete_distribution<int32_t> dist(probs.begin(), probs.end());
    return ids[dist(rng)];
}

TokenLogprob token_logprobs(const std::vector<float> & logits, int32_t tok, int32_t k, std::vector<int32_t> & ids) {
    const float lse = log_sum_exp(logits);
    auto lp = [&](int32_t t) { return logits[t] - lse; };
    TokenLogprob r{tok, lp(tok), {}};
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n_top = std::min<size_t>(size_t(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + n_top, ids.end(), [&](int32_t a, int32_t b) { return lp(a) > lp(b); });
    for (size_t j = 0; j < n_top; ++j) r.top.emplace_back(ids[j], lp(ids[j]));
    return r;
}

}  // namespace kvlab
