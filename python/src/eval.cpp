// Evaluation from Python (issue 31, deliverable 4): kvlab.evaluate(experiment) runs `kvlab eval`'s
// runner on an experiment (the JSON of a run's header `config`, as a dict or a file) and returns its
// records as dicts; Model.task_samples(task, ...) gives a task's samples (contexts, questions,
// answers) as the runner makes them, counted with the model's tokenizer.
#include <fstream>

#include "app/fetch.h"
#include "bindings.h"
#include "eval/report.h"
#include "eval/runner.h"
#include "kvlab/error.h"

namespace kvlab::py {

namespace {

using ModelClass = pb::class_<PyModel, std::shared_ptr<PyModel>>;

// KVLAB_DATA_DIR when set, else the essays installed with the package (kvlab/data/haystack)
std::string data_dir() {
    const std::string & d = environment().data_dir;
    if (!d.empty()) return d;
    const pb::object os_path = pb::module_::import("os.path");
    const pb::object here = os_path.attr("dirname")(pb::module_::import("kvlab").attr("__file__"));
    return os_path.attr("join")(here, "data").cast<std::string>();
}

eval::RunEnv run_env() {
    const app::Environment & e = environment();
    return {[&e](const std::string & m) { return resolve_model(m, e.models); }, e.cache_dir, data_dir()};
}

}  // namespace

void bind_eval(pb::module_ & m) {
    m.def(
        "evaluate",
        [](const pb::object & experiment, const pb::object & progress) {
            nlohmann::json j;
            if (pb::isinstance<pb::str>(experiment)) {
                const std::string path = experiment.cast<std::string>();
                std::ifstream in(path);
                if (!in) throw Error("python", "cannot read the experiment file " + path);
                try {
                    j = nlohmann::json::parse(in);
                } catch (const nlohmann::json::exception & e) {
                    throw Error("python", path + ": " + e.what());
                }
            } else {
                j = json_from_python(experiment);
            }
            const eval::RunConfig cfg = eval::RunConfig::from_json(j);
            std::function<void(const eval::Progress &)> on_progress;
            if (!progress.is_none())
                on_progress = [&progress](const eval::Progress & p) {
                    pb::gil_scoped_acquire gil;
                    progress(p.done, p.total, p.what);
                };
            const eval::RunEnv env = run_env();
            std::string out;
            {
                pb::gil_scoped_release nogil;
                out = eval::run(cfg, env, on_progress);
            }
            pb::list records;
            for (const nlohmann::json & r : eval::read_records({out})) records.append(json_to_python(r));
            return records;
        },
        pb::arg("experiment"), pb::arg("progress") = pb::none(),
        R"doc(Runs an evaluation as `kvlab eval` does and returns its records as dicts.

experiment: a dict with the keys of an experiment file (model, tasks, lengths, depths, samples,
methods, budgets, max_tokens, decode_policy, out_dir, ...; docs/evaluation.md), or the path of one.
The records are written to out_dir as by the CLI (resumed when they are there), then read back:
the header record (kind "header": configuration and provenance) and one record per answer (score,
fidelity, bytes, timings). progress(done, total, what), when given, is called as answers come.)doc");

    auto model = pb::reinterpret_borrow<ModelClass>(m.attr("Model"));
    model.def(
        "task_samples",
        [](const PyModel & pm, const std::string & task, const std::vector<int64_t> & lengths,
           const std::vector<double> & depths, int samples, uint64_t seed, int64_t long_tokens) {
            eval::TaskOptions o;
            o.lengths = lengths;
            o.depths = depths;
            o.n_samples = samples;
            o.seed = seed;
            o.long_tokens = long_tokens;
            const eval::Haystack hay = eval::load_haystack(eval::default_haystack(data_dir()));
            const eval::TokenCounter count = [&pm](const std::string & s) {
                return int64_t(pm.tok().encode(s, false).size());
            };
            pb::list out;
            for (const eval::Sample & s : eval::make_task(task, o, hay, count)) {
                nlohmann::json q = nlohmann::json::array();
                for (const eval::Question & x : s.questions)
                    q.push_back({{"question", x.question}, {"answers", x.answers}});
                out.append(json_to_python({{"id", s.id},
                                           {"task", s.task},
                                           {"metric", s.metric},
                                           {"context", s.context},
                                           {"questions", q},
                                           {"answer_tokens", s.answer_tokens},
                                           {"meta", s.meta}}));
            }
            return out;
        },
        pb::arg("task"), pb::arg("lengths") = std::vector<int64_t>{1024}, pb::arg("depths") = std::vector<double>{0.5},
        pb::arg("samples") = 1, pb::arg("seed") = 0, pb::arg("long_tokens") = 1024,
        "A task's samples as the evaluation makes them (the bundled essays as haystack), their lengths counted "
        "with this model's tokenizer: dicts with id, task, metric, context, questions [{question, answers}], "
        "answer_tokens and meta.");
}

}  // namespace kvlab::py
