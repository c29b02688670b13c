// kvlab demo [MODEL] [eval flags]: the main job, a fixed comparison on the default model and
// the bundled essays: needle-in-a-haystack and RULER's single needle at 1,536 tokens and
// three depths, 8 methods x 3 ratios against the full cache; prints the table, writes the
// records and the report.
#include "common.h"
#include "eval_cli.h"

namespace kvlab::cli {

namespace {

eval::RunConfig demo_config() {
    eval::RunConfig c;
    c.tasks = {"niah", "ruler_niah_single"};
    c.task.lengths = {1536};
    c.task.depths = {0.1, 0.5, 0.9};
    for (const char * m : {"streaming_llm", "snapkv", "pyramidkv", "h2o", "tova", "knorm", "adakv", "expected_attention"})
        c.methods.push_back({m, {}});
    for (double r : {0.5, 0.75, 0.9}) c.budgets.push_back({r, -1});
    c.max_tokens = 24;
    c.out_dir = "kvlab-demo";
    return c;
}

const CommandRegistrar reg("demo", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "demo",
        "The main job: 8 methods x 3 ratios vs the full cache on needle-in-a-haystack and RULER niah, "
        "default model, bundled essays; prints the table and writes the report");
    auto a = std::make_shared<EvalArgs>();
    a->flags = demo_config();
    add_model_arg(cmd, a->model, false)->default_str(a->flags.model);
    add_eval_options(cmd, a.get());
    cmd->callback([&rc, a] { rc = run_eval(resolve_eval(*a, a->flags), true); });
});

}  // namespace

}  // namespace kvlab::cli
