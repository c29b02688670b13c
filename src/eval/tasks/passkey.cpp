// Passkey retrieval (Mohtashami and Jaggi): a 5-digit pass key at each depth of repeated
// noise sentences.
#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

Sample gen_passkey(Job & job) {
    const std::string key = digits(job.rng, 5);
    Needles nd;
    nd.prefix =
        "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
        "it. I will quiz you about it.\n\n";
    nd.primary = "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
    nd.depth = job.depth;
    Sample s = needle_sample(job, Filler{&job.noise, 0, true}, nd);
    s.meta.erase("other_offsets");
    s.meta["needle"] = nd.primary;
    s.meta["passkey"] = key;
    s.metric = "string_match_all";
    s.questions = {{"What is the pass key?", {key}}};
    return s;
}

const TaskRegistrar reg({
    {"passkey", "a 5-digit pass key at each depth of repeated filler text", gen_passkey, true, false, 20},
});

}  // namespace
}  // namespace kvlab::eval::tasks
