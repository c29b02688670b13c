// kvlab compress MODEL --context-file F [--method M (--ratio R | --budget B)] -o doc.kvc:
// prefill a context once, compress its cache (or keep it full) and write it to a cache
// file that `kvlab ask --cache` and `kvlab serve` answer from, in any later process.
#include <cstdio>

#include "common.h"
#include "kvlab/cache_file.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {

struct CompressArgs {
    std::string model, context_file, output, system, method = "none", attention = "kvlab", preset;
    std::vector<std::string> params;
    BudgetArgs budget;
    bool json = false;
    int threads = 0, chunk = 512;
};

int run_compress(const CompressArgs & a) {
    const bool compressing = a.method != "none";
    if (!compressing && (a.budget.given() || !a.params.empty()))
        throw Error("compress", "--ratio, --budget and --param need --method (see `kvlab methods`)");
    if (compressing && !a.budget.given())
        throw Error("compress", "--method " + a.method + " needs --ratio R or --budget B");
    Loaded l = load(a.model, a.threads);
    std::vector<MethodRequest> methods;
    if (compressing) methods = {{a.method, apply_preset(a.preset, a.method, parse_params(a.params))}};
    const std::string text = read_file(a.context_file);
    const std::vector<ChatMessage> before =
        a.system.empty() ? std::vector<ChatMessage>{} : std::vector<ChatMessage>{{"system", a.system}};
    const std::vector<int32_t> context = l.tok->context_chat(before, text, {{"user", ""}}).context;
    Engine engine(*l.model, EngineOptions{a.chunk, parse_attention_kernel(a.attention)});

    // No reserve: a cache file holds rows only; its reader sizes the reserve it needs.
    ContextSession s(engine, methods, SessionOptions{0, 0, l.tok.get()});
    if (!a.json) std::fprintf(stderr, "[prefill]  %zu context tokens ...\n", context.size());
    s.prefill(context);
    const PrefillStats & ps = s.prefill_stats();
    const PreparedCache p = compressing ? s.compress(0, a.budget.budget()) : s.full();
    nlohmann::json info = {
        {"method", p.method},
        {"params", compressing ? s.press(0).params() : nlohmann::json::object()},
        {"budget", nullptr},
        {"preset", a.preset},
        {"before", before_json(before)},
        {"context_file", a.context_file},
        {"context_tokens", ps.n_tokens},
        {"prefill_s", ps.seconds},
        {"compression", p.stats.to_json()},
        {"achieved_ratio", achieved_ratio(p.cache, ps.n_tokens)},
        {"engine", {{"chunk_size", a.chunk}, {"attention", a.attention}, {"threads", l.model->n_threads()}}},
        {"provenance", provenance(*l.model, *l.tok)},
    };
    if (compressing) {
        const Budget b = a.budget.budget();
        info["budget"] = b.tokens >= 0 ? nlohmann::json{{"tokens", b.tokens}} : nlohmann::json{{"ratio", b.ratio}};
    }
    const double t0 = now_seconds();
    const uint64_t written = save_cache_file(a.output, *l.model, p.cache, CacheFileContent{text, context, info});
    const double write_s = now_seconds() - t0;
    if (a.json) {
        nlohmann::json j = info;
        j.erase("provenance");
        j["output"] = a.output;
        j["file_bytes"] = written;
        j["kv_bytes"] = p.cache.used_bytes();
        j["write_s"] = write_s;
        std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        return 0;
    }
    std::fprintf(stderr, "[prefill]  %.3f s (%.1f tok/s)\n", ps.seconds, ps.tokens_per_second());
    if (compressing)
        std::fprintf(stderr, "[compress] %s %s: %.3f s, %.1f%% of the KV pairs removed\n", a.method.c_str(),
                     a.budget.budget().describe().c_str(), p.stats.seconds(),
                     100.0 * achieved_ratio(p.cache, ps.n_tokens));
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
    add_threads_option(cmd, a->threads);
    add_chunk_option(cmd, a->chunk);
    add_attention_option(cmd, a->attention);
    add_json_flag(cmd, a->json, "what was written: tokens, rows, bytes, timings");
    cmd->callback([&rc, a] { rc = run_compress(*a); });
});

}  // namespace

}  // namespace kvlab::cli
