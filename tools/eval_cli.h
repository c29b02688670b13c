// What kvlab eval, demo and report share: the experiment flags (each overrides the key of
// the experiment file it names only when given), the progress bar and the report writer.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "common.h"
#include "eval/runner.h"

namespace kvlab::cli {

struct EvalArgs {
    eval::RunConfig flags;  // the options write here; their defaults are these values
    std::string model;
    std::vector<std::string> methods, params;
    std::vector<double> ratios;
    std::vector<int64_t> budgets;
    std::vector<double> bytes_ratios;
    std::vector<std::string> demote, cache_types;
    std::string shard;
    KernelArgs kernels;  // --products, --no-repack
    EngineArgs engine;   // --chunk, --attention, -ctk, -ctv
    DecodeArgs decode;   // --decode-policy, --decode-interval, --decode-target, --decode-param
    bool query_aware = false, multi_turn = false, no_report = false;
    // the options given on the command line, each with how it overrides a configuration
    std::vector<std::pair<CLI::Option *, std::function<void(eval::RunConfig &)>>> overrides;
};

// Adds MODEL (optional positional) and the experiment flags, bound to a->flags.
void add_eval_options(CLI::App * cmd, EvalArgs * a);
// The configuration: `base` (an experiment file's, or the flags' defaults) with every given
// flag applied.
eval::RunConfig resolve_eval(const EvalArgs & a, eval::RunConfig base);
// Runs it with a progress bar on stderr; writes and prints the report when unsharded.
int run_eval(const eval::RunConfig & c, bool report);
// Writes summary.md, the SVG plots and report.html into dir; prints the table.
void write_report(const std::vector<std::string> & files, const std::string & dir, bool print);
// The table of the answers in `files` and the best method per ratio and per byte budget, as
// summary.md holds them (markdown).
std::string summary_markdown(const std::vector<std::string> & files);

}  // namespace kvlab::cli
