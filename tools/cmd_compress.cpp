// kvlab compress MODEL --context-file F [--method M (--ratio R | --budget B)] -o doc.kvc:
// prefill a context once, compress its cache (or keep it full) and write it to a cache
// file that `kvlab ask --cache` and `kvlab serve` answer from, in any later process.
#include <cstdio>

#include "common.h"
#include "kvlab/cache_file.h"
#include "kvlab/compress_flow.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {

struct CompressArgs {
    std::string model, context_file, output, system, method = "none", preset;
    std::vector<std::string> params;
    BudgetArgs budget;
    bool json = false;
    int threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
};

int run_compress(const CompressArgs & a) {
    const bool compressing = a.method != "none";
    if (!compressing && (a.budget.any() || !a.params.empty()))
        throw Error("compress",
                    "a budget (--ratio, --budget, --kv-bytes, --bytes-ratio, --demote) and --param need --method (see "
                    "`kvlab methods`)");
    if (compressing && !a.budget.given())
        throw Error("compress",
                    "--method " + a.method + " needs a budget: --ratio R, --budget B, --kv-bytes N or --bytes-ratio R");
    Loaded l = load(a.model, a.kernels.options(a.threads));
    ContextJob job;
    job.text = read_file(a.context_file);
    if (!a.system.empty()) job.before = {{"system", a.system}};
    job.method = a.method;
    job.preset = a.preset;
    if (compressing) {
        job.params = apply_preset(a.preset, a.method, parse_params(a.params));
        job.budget = a.budget.budget();
    }
    Engine engine(*l.model, a.engine.options());
    MadeContext m = make_context(engine, *l.tok, job, [&](const std::string & phase, int64_t n) {
        if (!a.json && phase == "prefill") std::fprintf(stderr, "[prefill]  %lld context tokens ...\n", (long long)n);
    });
    const PreparedCache & p = m.prepared;
    nlohmann::json info = m.info;
    info["context_file"] = a.context_file;
    info["compression"] = p.stats.to_json();
    info["engine"] = a.engine.to_json();
    info["engine"]["threads"] = l.model->n_threads();
    info["provenance"] = provenance(*l.model, *l.tok);
    const double t0 = now_seconds();
    const uint64_t written = save_cache_file(a.output, *l.model, p.cache, CacheFileContent{job.text, m.tokens, info});
    const double write_s = now_seconds() - t0;
    if (a.json) {
        nlohmann::json j = info;
        j.erase("provenance");
        j["output"] = a.output;
        j["file_bytes"] = written;
        j["write_s"] = write_s;
        std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        return 0;
    }
    std::fprintf(stderr, "[prefill]  %.3f s (%.1f tok/s)\n", m.prefill.seconds, m.prefill.tokens_per_second());
    if (compressing)
        std::fprintf(stderr, "[compress] %s %s: %.3f s, %.1f%% of the KV pairs removed\n", a.method.c_str(),
                     job.budget->describe().c_str(), p.stats.seconds(), 100.0 * info["achieved_ratio"].get<double>());
    std::fprintf(stderr, "[write]    %s: %s (KV rows %s) in %.3f s\n", a.output.c_str(), human_bytes(written).c_str(),
                 human_bytes(p.cache.used_bytes()).c_str(), write_s);
    return 0;
}

const CommandRegistrar reg("compress", [](CLI::App & app, int & rc) {
    auto * cmd =
        app.add_subcommand("compress",
                           "Prefill a context once, compress its KV cache and write it to a cache file (.kvc) that "
                           "`kvlab ask --cache` and `kvlab serve` answer from");
    auto a = std::make_shared<CompressArgs>();
    add_model_arg(cmd, a->model);
    cmd->add_option("--context-file", a->context_file, "the long context (a text file)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("-o,--output", a->output, "the cache file to write (replaced atomically)")->required();
    cmd->add_option("--system", a->system, "a system message before the context");
    cmd->add_option("--method", a->method, "compression method (`kvlab methods`), or none for the full cache");
    add_budget_options(cmd, a->budget);
    add_param_option(cmd, a->params, false);
    add_preset_option(cmd, a->preset);
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    add_json_flag(cmd, a->json, "what was written: tokens, rows, bytes, timings");
    cmd->callback([&rc, a] { rc = run_compress(*a); });
});

}  // namespace

}  // namespace kvlab::cli
