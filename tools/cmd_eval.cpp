// kvlab eval [MODEL] [EXPERIMENT.json] [flags]: an experiment (a JSON file and/or flags) into
// JSONL records, resumable and shardable; the report at the end when unsharded.
#include "common.h"
#include "eval_cli.h"
#include "kvlab/error.h"

namespace kvlab::cli {

namespace {

struct EvalCommand {
    EvalArgs args;
    std::vector<std::string> positionals;  // [MODEL] [EXPERIMENT.json]
};

int run(EvalCommand & e) {
    std::string experiment;
    for (const std::string & p : e.positionals) {
        const bool json = p.size() > 5 && p.compare(p.size() - 5, 5, ".json") == 0;
        std::string & slot = json ? experiment : e.args.model;
        if (!slot.empty())
            throw Error("eval", "expected [MODEL] [EXPERIMENT.json], got two " +
                                    std::string(json ? "experiment files" : "models") + " ('" + slot + "', '" + p +
                                    "')");
        slot = p;
    }
    eval::RunConfig base = e.args.flags;
    if (!experiment.empty()) {
        nlohmann::json j = read_json_file(experiment);
        try {
            base = eval::RunConfig::from_json(j);
        } catch (const Error & err) {
            throw Error("eval", experiment + ": " + err.what());
        }
    }
    return run_eval(resolve_eval(e.args, base), !e.args.no_report);
}

const CommandRegistrar reg("eval", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "eval", "Run an evaluation: tasks x methods x budgets, one JSONL record per answer (resumable, shardable)");
    auto e = std::make_shared<EvalCommand>();
    cmd->add_option("MODEL|EXPERIMENT", e->positionals,
                    "[MODEL] [EXPERIMENT.json]: a model (short name or .gguf path; default " + e->args.flags.model +
                        ") and/or a JSON experiment file whose keys the flags override")
        ->expected(0, 2);
    add_eval_options(cmd, &e->args);
    cmd->add_flag("--no-report", e->args.no_report, "do not write the report at the end");
    cmd->callback([&rc, e] { rc = run(*e); });
});

}  // namespace

}  // namespace kvlab::cli
