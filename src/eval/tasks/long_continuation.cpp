// Long generation (issue "KVzap": compression while decoding needs answers long enough to
// compress): an essay excerpt of the target length, cut after any word, and the request to
// continue it. Every configuration generates exactly long_tokens tokens (EOG does not stop it)
// and is compared with the full cache's own continuation by teacher forcing: the metric
// "fidelity" scores an answer by its top-1 agreement there (the full cache scores 1); the
// records' KL and top-1 are the figures to read.
#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {
namespace {

Sample gen_long_continuation(Job & job) {
    const Filler filler = essay_filler(job);
    auto [b, n_tokens] = fit(job, 1, [&](size_t n) { return build_needles(filler, n, Needles{}); });
    Sample s;
    s.context = std::move(b.context);
    s.meta = {{"context_tokens", n_tokens}, {"answer_tokens", job.long_tokens}};
    s.metric = "fidelity";
    s.answer_tokens = job.long_tokens;
    s.questions = {{"Continue the text above from where it stops, in the same style, for as long as you can.", {}}};
    return s;
}

const TaskRegistrar reg({
    {"long_continuation",
     "continue an essay excerpt for --long-tokens tokens (default 1,024); fidelity to the full cache's own "
     "continuation (KL, top-1), for compression while decoding",
     gen_long_continuation, false, true, 80},
});

}  // namespace
}  // namespace kvlab::eval::tasks
