// Needle in a haystack (Kamradt): the San Francisco sandwich sentence at each depth of the
// essays; both parts of the answer must appear (string_match_all).
#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

Sample gen_niah(Job & job) {
    const std::string needle =
        "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
    Needles nd;
    nd.primary = needle;
    nd.depth = job.depth;
    Sample s = needle_sample(job, essay_filler(job), nd);
    s.meta.erase("other_offsets");
    s.meta["needle"] = needle;
    s.metric = "string_match_all";
    s.questions = {{"What is the best thing to do in San Francisco?", {"eat a sandwich", "Dolores Park"}}};
    return s;
}

const TaskRegistrar reg({
    {"niah", "a needle sentence at each depth of the essays (the San Francisco sandwich)", gen_niah, true, true, 10},
});

}  // namespace
}  // namespace kvlab::eval::tasks
