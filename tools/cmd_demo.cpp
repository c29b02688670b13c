// kvlab demo [MODEL] [eval flags]: the main job, a fixed comparison on the default model and
// the bundled essays. Two runs, one report:
//  1. query-agnostic: needle-in-a-haystack, RULER's single needle (three depths) and the
//     many-questions task (six facts, six questions from one compressed cache) at 1,024
//     tokens, 2 samples each (24 answers per row); 10 methods (kvzip and kvzap among them) x
//     ratios 0.5 and 0.75 against the full cache (kvzap's scorer trained on first use where
//     the model has none; the default model's is bundled, data/scorers/, installed by the set-up);
//  2. query-aware SnapKV in the multi-turn setting: compressed with each sample's first
//     question in its window, then every question answered from that cache (rows
//     "snapkv (multi-turn)"; on the one-question needle tasks it is plain query-aware SnapKV);
//  3. memory at equal bytes: the full caches at F16, Q8_0 and Q4_0 (reference points) and KVzip
//     within 25% and 12.5% of the F16 full cache's bytes, evicting at each of the three cache
//     types or keeping at Q4_0 the rows it would evict (cut to one method to stay within 10
//     minutes on 2 cores; `kvlab eval --methods ... --bytes-ratios ... --demote ... --cache-types
//     ...` runs any other).
// Prints each part's table as it completes (with the best method at each ratio, the best
// configuration within each byte budget); writes the records and the report of all three.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common.h"
#include "eval_cli.h"
#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "train_scorer.h"

namespace kvlab::cli {

namespace {

eval::RunConfig demo_config() {
    eval::RunConfig c;
    c.tasks = {"niah", "ruler_niah_single", "many_facts"};
    c.task.lengths = {1024};
    c.task.depths = {0.1, 0.5, 0.9};
    c.task.n_samples = 2;
    for (const char * m : {"streaming_llm", "snapkv", "pyramidkv", "h2o", "tova", "knorm", "adakv",
                           "expected_attention", "kvzip", "kvzap"})
        c.methods.push_back({m, {}});
    for (double r : {0.5, 0.75}) c.budgets.push_back(eval::BudgetConfig::ratio(r));
    c.max_tokens = 32;
    c.out_dir = "kvlab-demo";
    return c;
}

// kvzap's scorer, trained on first use when the model has none (the set-up trains the default
// model's): the demo needs no extra step on any model.
void ensure_kvzap_scorer(const eval::RunConfig & c) {
    if (std::none_of(c.methods.begin(), c.methods.end(), [](const auto & m) { return m.name == "kvzap"; })) return;
    {
        const Loaded l = load(c.model, KernelArgs{}.options(1));
        try {
            scorer_for(*l.model, "", Surrogate::Kind::linear);
            return;
        } catch (const Error &) {
        }
    }
    std::fprintf(stderr,
                 "[demo] %s has no KVzap scorer yet: training it once (`kvlab train-scorer %s`, a few minutes; "
                 "docs/kvzap.md)\n",
                 c.model.c_str(), c.model.c_str());
    if (train_default_scorer(c.model, c.threads) != 0) throw Error("demo", "training kvzap's scorer failed");
}

// The part's table on stdout as soon as it is complete (sharded runs print none: `kvlab report`).
void print_part(const eval::RunConfig & c, const char * title) {
    if (c.n_shards != 1) return;
    std::printf("## %s\n\n%s\n", title,
                summary_markdown({(std::filesystem::path(c.out_dir) / "records-0-of-1.jsonl").string()}).c_str());
    std::fflush(stdout);
}

int run_demo(const eval::RunConfig & c) {
    ensure_kvzap_scorer(c);
    run_eval(c, false);
    print_part(c, "Needles and many questions: 10 methods x 2 ratios against the full cache");
    eval::RunConfig qa = c;
    qa.methods = {{"snapkv", {}}};
    qa.multi_turn = true;
    qa.out_dir = (std::filesystem::path(c.out_dir) / "multi-turn").string();
    std::fprintf(stderr, "[demo] query-aware SnapKV, the first question in its window (multi-turn)\n");
    run_eval(qa, false);
    print_part(qa, "Query-aware SnapKV in the multi-turn setting");
    eval::RunConfig bytes = c;
    bytes.methods = {{"kvzip", {}}};
    bytes.budgets.clear();
    for (const char * demote : {"", "q4_0"})
        for (double r : {0.25, 0.125}) {
            Budget b = Budget::from_bytes_ratio(r);
            if (*demote) b.set_demotion(parse_cache_type(demote), -1.0);
            bytes.budgets.push_back({b});
        }
    bytes.cache_types = {"f16", "q8_0", "q4_0"};
    bytes.out_dir = (std::filesystem::path(c.out_dir) / "bytes").string();
    std::fprintf(stderr, "[demo] memory at equal bytes: KVzip evicting at F16, Q8_0 or Q4_0, or demoting to Q4_0\n");
    run_eval(bytes, false);
    print_part(bytes, "Memory at equal bytes: KVzip within 25% and 12.5% of the F16 full cache");
    if (c.n_shards == 1)
        write_report({(std::filesystem::path(c.out_dir) / "records-0-of-1.jsonl").string(),
                      (std::filesystem::path(qa.out_dir) / "records-0-of-1.jsonl").string(),
                      (std::filesystem::path(bytes.out_dir) / "records-0-of-1.jsonl").string()},
                     c.out_dir, false);
    return 0;
}

const CommandRegistrar reg("demo", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "demo",
        "The main job: 10 methods (kvzip and kvzap among them) x 2 ratios vs the full cache on needle tasks and a "
        "many-questions task, query-aware SnapKV in the multi-turn setting, and KVzip at equal bytes (25% and 12.5% "
        "of the F16 full cache: evicting at F16, Q8_0 or Q4_0, or demoting to Q4_0); default model, bundled essays; "
        "prints the table, the best method per ratio and per byte budget, writes the report");
    auto a = std::make_shared<EvalArgs>();
    a->flags = demo_config();
    add_model_arg(cmd, a->model, false)->default_str(a->flags.model);
    add_eval_options(cmd, a.get());
    cmd->callback([&rc, a] { rc = run_demo(resolve_eval(*a, a->flags)); });
});

}  // namespace

}  // namespace kvlab::cli
