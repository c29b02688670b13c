// Shared pieces of the kvlab subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "kvlab/cache.h"
#include "kvlab/engine.h"
#include "kvlab/model.h"
#include "kvlab/text.h"

namespace kvlab::cli {

struct Loaded {
    std::string path;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
};

// Resolves a short name or path (fetching a known model if needed) and loads it.
Loaded load(const std::string & name_or_path, int n_threads);

int default_threads();

// Process and buffer memory figures, in bytes.
nlohmann::json memory_json(const Model & model, const KvStore * cache, const Engine * engine);

// The median of repetitions (0 for none).
double median(std::vector<double> v);

std::string read_file(const std::string & path);

// --attention kvlab|ggml, the same help everywhere.
void add_attention_option(CLI::App * cmd, std::string & value);
std::string human_bytes(uint64_t n);

// Each subcommand registers itself on the app; its callback stores the exit code.
void add_info_command(CLI::App & app, int & rc);
void add_generate_command(CLI::App & app, int & rc);
void add_bench_command(CLI::App & app, int & rc);
void add_models_command(CLI::App & app, int & rc);
void add_methods_command(CLI::App & app, int & rc);
void add_ask_command(CLI::App & app, int & rc);
void add_bench_methods_command(CLI::App & app, int & rc);
void add_eval_commands(CLI::App & app, int & rc);  // eval, report, demo

}  // namespace kvlab::cli
