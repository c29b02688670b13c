// RULER's frequent-words extraction: coded words with Zipf-distributed counts; the 3 most
// frequent are asked for.
#include <algorithm>
#include <set>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

// Frequent-words extraction: coded words with Zipf counts C/r (r = 1..K), then words once each.
Built fwe_text(std::mt19937_64 rng, const std::string & prefix, size_t n) {
    size_t k = 10;
    double h = 0;
    for (size_t r = 1; r <= k; ++r) h += 1.0 / double(r);
    while (k < 20000 && double(k + 1) * (h + 1.0 / double(k + 1)) <= double(n)) ++k, h += 1.0 / double(k);
    const size_t c = size_t(double(n) / h);  // >= k for n >= 60, so every count C/r >= 1
    std::vector<size_t> counts;
    size_t total = 0;
    for (size_t r = 1; r <= k; ++r) counts.push_back(std::max<size_t>(1, c / r)), total += counts.back();
    while (total < n) counts.push_back(1), ++total;
    KVLAB_ASSERT(counts.size() > 3 && counts[2] > counts[3] && total == n, "fwe counts");
    std::vector<std::string> vocab;
    std::set<std::string> seen;
    while (vocab.size() < counts.size()) {
        std::string w = letters(rng, 5, 'a');
        if (seen.insert(w).second) vocab.push_back(w);
    }
    std::vector<std::string> text;
    text.reserve(n);
    for (size_t r = 0; r < counts.size(); ++r) text.insert(text.end(), counts[r], vocab[r]);
    shuffle(text, rng);
    Built b;
    b.context = prefix;
    for (size_t i = 0; i < text.size(); ++i) b.context += (i ? " " : "") + text[i];
    b.facts = {{"top_words", std::vector<std::string>(vocab.begin(), vocab.begin() + 3)},
               {"top_counts", std::vector<size_t>(counts.begin(), counts.begin() + 3)},
               {"vocab_size", vocab.size()},
               {"n_words", n}};
    return b;
}

Sample gen_fwe(Job & job) {
    const std::string prefix =
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appearing coded words.\n\n";
    return extraction_sample(
        job, 60, [&](size_t n) { return fwe_text(job.rng, prefix, n); },
        "What are the three most frequently appearing coded words in the text above?", "top_words");
}

const TaskRegistrar reg({
    {"ruler_fwe", "RULER frequent-words extraction: the 3 most frequent coded words (Zipf counts)", gen_fwe, false,
     false, 60},
});

}  // namespace
}  // namespace kvlab::eval::tasks
