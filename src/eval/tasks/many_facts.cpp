// Many questions on one context (KVzip's setting, issue "query-agnostic compression"): six
// "special magic numbers" for six word-pair keys at depths spread over the essays
// (0.05 .. 0.95), and one question per key, in the order of the text: every question is
// answered from the same compressed cache. Records carry the question's index, so reports
// split the first question from the later ones.
#include <algorithm>
#include <set>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

constexpr size_t k_facts = 6;

Sample gen_many_facts(Job & job) {
    const Vocabulary & v = vocabulary();
    std::vector<std::string> keys, values;
    std::set<std::string> used;
    while (keys.size() < k_facts) {
        std::string k = v.adjectives[pick(job.rng, v.adjectives.size())] + "-" + v.nouns[pick(job.rng, v.nouns.size())];
        if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
        std::string val = digits(job.rng, 7);
        if (!used.insert(val).second) continue;
        keys.push_back(k);
        values.push_back(val);
    }
    Needles nd;
    for (size_t i = 0; i < k_facts; ++i) {
        nd.others.push_back("One of the special magic numbers for " + keys[i] + " is: " + values[i] + ".");
        nd.fractions.push_back(0.05 + 0.9 * double(i) / double(k_facts - 1));
    }
    Sample s = needle_sample(job, essay_filler(job), nd);
    nlohmann::json facts = nlohmann::json::array();
    for (size_t i = 0; i < k_facts; ++i) {
        const double off = s.meta["other_offsets"][i].get<double>();
        facts.push_back({{"key", keys[i]},
                         {"value", values[i]},
                         {"depth", s.context.empty() ? 0.0 : off / double(s.context.size())}});
        s.questions.push_back(
            {"What is the special magic number for " + keys[i] + "?", {values[i]}});
    }
    s.meta.erase("other_offsets");
    s.meta["facts"] = facts;
    s.metric = "string_match_all";
    return s;
}

const TaskRegistrar reg({
    {"many_facts",
     "six magic numbers at depths 0.05 .. 0.95 of the essays, one question each, all from one compressed cache",
     gen_many_facts, false, true, 35},
});

}  // namespace
}  // namespace kvlab::eval::tasks
