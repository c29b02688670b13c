// RULER's variable tracking: one chain of assignments hidden in the noise sentences; the
// answer is the name of every variable that holds the value.
#include <algorithm>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

// Variable tracking: one chain of 4 hops, VAR A = N, VAR B = VAR A, ..., in order in the noise.
Sample gen_vt(Job & job) {
    constexpr size_t kVars = 5;
    const std::string value = digits(job.rng, 5);
    std::vector<std::string> names;
    while (names.size() < kVars) {
        std::string n = letters(job.rng, 5, 'A');
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    Needles nd;
    nd.prefix = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
    for (size_t i = 0; i < kVars; ++i) {
        nd.others.push_back("VAR " + names[i] + " = " + (i == 0 ? value : "VAR " + names[i - 1]) + ".");
        nd.fractions.push_back(uniform01(job.rng));
    }
    Sample s = needle_sample(job, Filler{&job.noise, 0, true}, nd);
    s.meta["chain"] = names;
    s.meta["value"] = value;
    s.meta["line_offsets"] = s.meta["other_offsets"];
    s.meta.erase("other_offsets");
    s.metric = "string_match_all";
    s.questions = {{"Find all variables that are assigned the value " + value + " in the text above.", names}};
    return s;
}

const TaskRegistrar reg({
    {"ruler_vt", "RULER variable tracking: the 5 variables of a 4-hop chain VAR B = VAR A = N", gen_vt, false, false,
     40},
});

}  // namespace
}  // namespace kvlab::eval::tasks
