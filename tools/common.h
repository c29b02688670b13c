// Shared pieces of the kvlab subcommands: loading a model, the option helpers that give
// every subcommand the same grammar (MODEL positional, comma-separated lists, one --param
// grammar, the same threads / chunk / attention / json / budget options), and printing.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/load.h"
#include "app/options.h"
#include "command.h"
#include "kvlab/cache.h"
#include "kvlab/decode_policy.h"
#include "kvlab/engine.h"
#include "kvlab/model.h"
#include "kvlab/press.h"
#include "kvlab/text.h"

namespace kvlab::cli {

using app::Loaded;
// Resolves a short name or path in the environment's model store (fetching a known model if
// needed) and loads it (app::load).
Loaded load(const std::string & name_or_path, const ModelOptions & opts);

// The kernels' choices on the command line: --products and --no-repack (llama.cpp's flag).
struct KernelArgs : app::KernelArgs {
    ModelOptions options(int n_threads) const;  // throws for --products amx where the CPU lacks it
};
void add_kernel_options(CLI::App * cmd, KernelArgs & k);

using app::resolve_threads;

// --- options -------------------------------------------------------------------------
// MODEL, the first positional of every subcommand that takes a model.
CLI::Option * add_model_arg(CLI::App * cmd, std::string & model, bool required = true);
CLI::Option * add_threads_option(CLI::App * cmd, int & threads);
CLI::Option * add_chunk_option(CLI::App * cmd, int & chunk);
CLI::Option * add_attention_option(CLI::App * cmd, std::string & value);  // --attention kvlab|ggml

// The engine's choices on the command line: --chunk, --attention, -ctk / -ctv (llama.cpp's
// --cache-type-k / --cache-type-v: f16, q8_0, q4_0), --no-kv-rotation.
using app::EngineArgs;
void add_engine_options(CLI::App * cmd, EngineArgs & e);
// -t, the kernels' and the engine's options: what every command that runs the model takes.
void add_run_options(CLI::App * cmd, int & threads, KernelArgs & k, EngineArgs & e);
// Compression while decoding: --decode-policy, --decode-interval, --decode-target,
// --decode-param KEY=VALUE (kvzap's threshold, window, scorer, kind); docs/methods.md.
using app::DecodeArgs;
void add_decode_policy_options(CLI::App * cmd, DecodeArgs & d);

CLI::Option * add_json_flag(CLI::App * cmd, bool & json, const std::string & what);
// A comma-separated list (`--x a,b,c`; repeating the flag appends).
template <typename T>
CLI::Option * add_list_option(CLI::App * cmd, const std::string & name, std::vector<T> & values,
                              const std::string & help) {
    return cmd->add_option(name, values, help + " (comma-separated)")->delimiter(',');
}

// --ratio R | --budget B | --kv-bytes N | --bytes-ratio R (at most one), --demote T, --high-share F.
using app::BudgetArgs;
void add_budget_options(CLI::App * cmd, BudgetArgs & b);

// --param: `KEY=VALUE` where one method runs, `METHOD:KEY=VALUE` where several do (a bare
// KEY=VALUE is accepted there when exactly one method runs).
CLI::Option * add_param_option(CLI::App * cmd, std::vector<std::string> & params, bool per_method);
// --preset kvpress: each method's parameters follow kvpress's rules (`kvlab methods`); --param
// still overrides them.
CLI::Option * add_preset_option(CLI::App * cmd, std::string & preset);
using app::parse_method_params;
using app::parse_params;

// --- output ----------------------------------------------------------------------------
// Process and buffer memory figures, in bytes.
nlohmann::json memory_json(const Model & model, const KvStore * cache, const Engine * engine);

// The median of repetitions (0 for none).
double median(std::vector<double> v);

// The whole file; throws kvlab::Error naming the file.
std::string read_file(const std::string & path);
// A JSON file; throws kvlab::Error naming the file and the parse error.
nlohmann::json read_json_file(const std::string & path);

std::string human_bytes(uint64_t n);

}  // namespace kvlab::cli
