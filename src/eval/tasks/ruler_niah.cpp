// RULER's needle-in-a-haystack variants: "special magic number" key-value needles in the
// essays; single, multi-key (distractor keys), multi-value and multi-query.
#include <algorithm>
#include <set>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

using json = nlohmann::json;

std::string magic_needle(const std::string & key, const std::string & value) {
    return "One of the special magic numbers for " + key + " is: " + value + ".";
}

// RULER's niah variants: n_keys keys (the first asked, unless all are), n_values values each.
Sample ruler_niah(Job & job, size_t n_keys, size_t n_values, bool ask_all_keys) {
    const Vocabulary & v = vocabulary();
    std::vector<std::string> keys;
    while (keys.size() < n_keys) {
        std::string k = v.adjectives[pick(job.rng, v.adjectives.size())] + "-" + v.nouns[pick(job.rng, v.nouns.size())];
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
    }
    std::vector<std::vector<std::string>> values(n_keys);
    std::set<std::string> used;
    for (auto & vs : values)
        while (vs.size() < n_values) {
            std::string val = digits(job.rng, 7);
            if (used.insert(val).second) vs.push_back(val);
        }
    Needles nd;
    nd.primary = magic_needle(keys[0], values[0][0]);
    nd.depth = job.depth;
    // the others keep their order in the text (sorted random positions): shuffle that order
    std::vector<std::pair<size_t, size_t>> order;  // (key, value) of each other needle
    for (size_t k = 0; k < n_keys; ++k)
        for (size_t j = 0; j < n_values; ++j)
            if (k || j) order.emplace_back(k, j);
    shuffle(order, job.rng);
    for (const auto & [k, j] : order) {
        nd.others.push_back(magic_needle(keys[k], values[k][j]));
        nd.fractions.push_back(uniform01(job.rng));
    }
    Sample s = needle_sample(job, essay_filler(job), nd);
    json all = json::array({{{"key", keys[0]}, {"value", values[0][0]}, {"offset", s.meta["needle_offset"]}}});
    for (size_t i = 0; i < order.size(); ++i) {
        const auto [k, j] = order[i];
        all.push_back({{"key", keys[k]}, {"value", values[k][j]}, {"offset", s.meta["other_offsets"][i]}});
    }
    s.meta.erase("other_offsets");
    s.meta["needles"] = all;
    s.metric = "string_match_all";
    if (ask_all_keys) {
        std::string list;
        std::vector<std::string> answers;
        for (size_t k = 0; k < n_keys; ++k) {
            list += (k == 0 ? "" : k + 1 == n_keys ? ", and " : ", ") + keys[k];
            answers.insert(answers.end(), values[k].begin(), values[k].end());
        }
        s.meta["keys"] = keys;
        s.questions = {
            {"What are all the special magic numbers for " + list + " mentioned in the provided text?", answers}};
    } else {
        s.meta["key"] = keys[0];
        if (n_keys > 1) s.meta["distractor_keys"] = std::vector<std::string>(keys.begin() + 1, keys.end());
        const std::string q = n_values > 1 ? "What are all the special magic numbers for " + keys[0]
                                           : "What is the special magic number for " + keys[0];
        s.questions = {{q + " mentioned in the provided text?", values[0]}};
    }
    s.meta["values"] = values;
    return s;
}

const TaskRegistrar reg({
    {"ruler_niah_single", "RULER: one special magic number (7 digits) for a word-pair key in the essays",
     [](Job & j) { return ruler_niah(j, 1, 1, false); }, true, true, 30},
    {"ruler_niah_multikey", "RULER: the magic number of one key among 3 distractor keys",
     [](Job & j) { return ruler_niah(j, 4, 1, false); }, true, true, 31},
    {"ruler_niah_multivalue", "RULER: one key with 4 magic numbers, all asked for",
     [](Job & j) { return ruler_niah(j, 1, 4, false); }, true, true, 32},
    {"ruler_niah_multiquery", "RULER: 4 keys with a magic number each, all asked at once",
     [](Job & j) { return ruler_niah(j, 4, 1, true); }, true, true, 33},
});

}  // namespace
}  // namespace kvlab::eval::tasks
