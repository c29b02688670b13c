// RULER's common-words extraction: a numbered word list in which 10 words are the most
// common; all 10 are asked for.
#include <algorithm>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

// Common-words extraction: a numbered list where 10 words appear freq_cw times and the rest
// freq_ucw times (RULER: 30 and 3; fewer in short lists, more when the vocabulary runs out).
Built cwe_list(std::mt19937_64 rng, const std::string & prefix, size_t n) {
    std::vector<std::string> words = vocabulary().all;
    shuffle(words, rng);
    constexpr size_t kCommon = 10;
    const size_t n_uncommon_words = words.size() - kCommon;
    size_t fc = std::clamp<size_t>(n * 3 / 100, 2, 30);
    const size_t fu0 = std::clamp<size_t>(fc / 3, 1, 3);
    auto need_fu = [&](size_t fc_) {
        const size_t u = n > kCommon * fc_ ? n - kCommon * fc_ : 0;
        return std::max(fu0, (u + n_uncommon_words - 1) / n_uncommon_words);
    };
    size_t fu = need_fu(fc);
    while (fu >= fc) fc = 2 * fu, fu = need_fu(fc);
    std::vector<std::string> list;
    for (size_t i = 0; i < kCommon; ++i) list.insert(list.end(), fc, words[i]);
    for (size_t j = kCommon; list.size() < n; ++j) {
        KVLAB_ASSERT(j < words.size(), "cwe vocabulary exhausted");
        for (size_t r = 0; r < fu && list.size() < n; ++r) list.push_back(words[j]);
    }
    shuffle(list, rng);
    Built b;
    b.context = prefix;
    for (size_t i = 0; i < list.size(); ++i) b.context += (i ? "\n" : "") + std::to_string(i + 1) + ". " + list[i];
    b.facts = {{"common_words", std::vector<std::string>(words.begin(), words.begin() + kCommon)},
               {"freq_common", fc},
               {"freq_uncommon", fu},
               {"n_words", list.size()}};
    return b;
}

Sample gen_cwe(Job & job) {
    const std::string prefix =
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n\n";
    return extraction_sample(
        job, 30, [&](size_t n) { return cwe_list(job.rng, prefix, n); },
        "What are the 10 most common words in the list above?", "common_words");
}

const TaskRegistrar reg({
    {"ruler_cwe", "RULER common-words extraction: the 10 most common words of a numbered list", gen_cwe, false, false,
     50},
});

}  // namespace
}  // namespace kvlab::eval::tasks
