// kvlab bench-methods MODEL: every compression method on one long context: compression
// time as a fraction of the prefill, and decode speed from the compressed cache against
// the full cache; medians of repetitions. One prefill per repetition serves every method
// (their observers run side by side; each method's scoring time is its own), or, with
// --prefill-per-method, each method prefills the context on its own, observed by it alone,
// after a prefill observed by none (the figures of one (context, method) run as a user runs it).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "common.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/provenance.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {
struct BenchMethodsArgs {
    std::string model, context_file, tokens_file, dump_plans, preset;
    std::vector<std::string> methods = {"all"}, params;
    int context = 4096, reps = 3, n_decode = 32, threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
    double ratio = 0.875;
    bool json = false, prefill_per_method = false;
};

// The context: the first `context` tokens of the file, or real token ids drawn from the
// vocabulary (speeds do not depend on the text).
std::vector<int32_t> bench_tokens(const BenchMethodsArgs & a, const Loaded & l) {
    std::vector<int32_t> toks;
    if (!a.tokens_file.empty()) {  // token ids given by another tool (scripts/bench-kvpress.sh)
        try {
            toks = read_json_file(a.tokens_file).get<std::vector<int32_t>>();
        } catch (const nlohmann::json::exception & e) {
            throw Error("bench-methods", a.tokens_file + ": not a JSON array of token ids: " + e.what());
        }
        if (int64_t(toks.size()) < a.context)
            throw Error("bench-methods", a.tokens_file + " has only " + std::to_string(toks.size()) + " token ids");
        toks.resize(size_t(a.context));
        return toks;
    }
    if (!a.context_file.empty()) {
        toks = l.tok->encode(read_file(a.context_file));
        if (int64_t(toks.size()) < a.context)
            throw Error("bench-methods", a.context_file + " has only " + std::to_string(toks.size()) + " tokens");
        toks.resize(size_t(a.context));
        return toks;
    }
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> dist(0, l.model->hparams().n_vocab - 1);
    toks.resize(size_t(a.context));
    for (auto & t : toks) t = dist(rng);
    return toks;
}

// Every repetition of every method: one prefill per repetition serves them all.
struct Measurements {
    std::vector<double> prefill_s, full_decode;
    struct PerMethod {
        std::vector<double> comp_s, frac, dec, speedup;
        std::vector<double> prefill_s;  // --prefill-per-method: the model's part of its own prefill
        nlohmann::json last;            // bytes, rows and times of the last repetition
    };
    std::vector<PerMethod> methods;
};

// DIR/METHOD.json: the rows the method kept, {"method", "params", "L", "kept": [layer][head][positions]},
// and for methods that rank rows the scores ranked, "scores": [layer][head][L] with "forced": [L]
// (the rows kept whatever their score) (for scripts/xcheck-kvpress.sh, which compares them with
// kvpress's on the same token ids).
void dump_plan(const std::string & dir, const MethodRequest & m, const KvStore & cache, int64_t L,
               const Press::RowScores & scores) {
    std::filesystem::create_directories(dir);
    nlohmann::json kept = nlohmann::json::array();
    for (int il = 0; il < cache.n_layer(); ++il) {
        nlohmann::json layer = nlohmann::json::array();
        for (int h = 0; h < cache.n_head_kv(); ++h) layer.push_back(cache.positions(il, h));
        kept.push_back(layer);
    }
    const std::string path = (std::filesystem::path(dir) / (m.name + ".json")).string();
    std::ofstream os(path);
    nlohmann::json j{{"method", m.name}, {"params", m.params}, {"L", L}, {"kept", kept}};
    if (!scores.s.empty()) {
        j["scores"] = scores.s;
        j["forced"] = std::vector<int>(scores.forced.begin(), scores.forced.end());
    }
    os << j.dump() << "\n";
    if (!os.flush()) throw Error("bench-methods", "cannot write " + path);
}

Measurements measure(const BenchMethodsArgs & a, Engine & engine, const Tokenizer & tok,
                     const std::vector<MethodRequest> & methods, const std::vector<int32_t> & toks) {
    const Budget budget = Budget::from_ratio(a.ratio);
    // one query token, then n_decode single-token steps: the decode speed of a cache
    const SessionOptions so{1, a.n_decode + 1, &tok};
    const ContextSession validate(engine, methods, so);  // names a bad method before the long run
    GenerateOptions go;
    go.max_tokens = a.n_decode + 1;
    go.stop_on_eog = false;
    Measurements m;
    m.methods.resize(methods.size());
    // method i's compression of session s's context (its index there: at), after a prefill of model_s
    auto record = [&](int rep, size_t i, ContextSession & s, size_t at, double model_s) {
        if (!a.json)
            std::fprintf(stderr, "\r[bench] repetition %d/%d: %-20s", rep + 1, a.reps, methods[i].name.c_str());
        const PreparedCache p = s.compress(at, budget);
        if (rep == 0 && !a.dump_plans.empty())
            dump_plan(a.dump_plans, methods[i], p.cache, int64_t(toks.size()), s.press(at).last_scores());
        const CompressStats & st = p.stats;
        Measurements::PerMethod & pm = m.methods[i];
        pm.comp_s.push_back(st.seconds());
        pm.frac.push_back(st.seconds() / model_s);
        pm.dec.push_back(s.answer(p.cache, {toks[0]}, go).decode_tokens_per_second());
        pm.speedup.push_back(pm.dec.back() / m.full_decode.back());
        pm.last = {{"bytes_before", st.bytes_before},
                   {"bytes_after", st.bytes_after},
                   {"rows_before", st.rows_before},
                   {"rows_after", st.rows_after},
                   {"observe_s", st.observe_s},
                   {"plan_s", st.plan_s},
                   {"apply_s", st.apply_s}};
    };
    for (int rep = 0; rep < a.reps; ++rep) {
        if (!a.json)
            std::fprintf(stderr, "[bench] repetition %d/%d: prefill %d tokens ...\n", rep + 1, a.reps, a.context);
        ContextSession s(engine, a.prefill_per_method ? std::vector<MethodRequest>{} : methods, so);
        s.prefill(toks);
        const double model_s = s.prefill_stats().seconds;
        m.prefill_s.push_back(model_s);
        m.full_decode.push_back(s.answer(s.full().cache, {toks[0]}, go).decode_tokens_per_second());
        for (size_t i = 0; i < methods.size(); ++i) {
            if (!a.prefill_per_method) {
                record(rep, i, s, i, model_s);
                continue;
            }
            ContextSession own(engine, {methods[i]}, so);
            own.prefill(toks);
            m.methods[i].prefill_s.push_back(own.prefill_stats().seconds);
            record(rep, i, own, 0, own.prefill_stats().seconds);
        }
        if (!a.json) std::fprintf(stderr, "\n");
    }
    return m;
}

void print_table(const BenchMethodsArgs & a, const std::vector<MethodRequest> & methods, const Measurements & m) {
    std::printf("context %d tokens, ratio %.3f: prefill %.2f s (median of %d), full-cache decode %.1f tok/s\n\n",
                a.context, a.ratio, median(m.prefill_s), a.reps, median(m.full_decode));
    std::printf("%-20s %12s %12s %14s %10s %12s\n", "method", "compress s", "% prefill", "decode tok/s", "vs full",
                "KV after");
    for (size_t i = 0; i < methods.size(); ++i) {
        const Measurements::PerMethod & pm = m.methods[i];
        std::printf("%-20s %12.3f %11.2f%% %14.1f %9.2fx %12s\n", methods[i].name.c_str(), median(pm.comp_s),
                    100.0 * median(pm.frac), median(pm.dec), median(pm.speedup),
                    human_bytes(pm.last["bytes_after"].get<uint64_t>()).c_str());
    }
}

nlohmann::json to_json(const BenchMethodsArgs & a, const std::vector<MethodRequest> & methods, const Measurements & m) {
    nlohmann::json results = nlohmann::json::array();
    for (size_t i = 0; i < methods.size(); ++i) {
        const Measurements::PerMethod & pm = m.methods[i];
        results.push_back({{"method", methods[i].name},
                           {"params", methods[i].params},
                           {"compression_s", median(pm.comp_s)},
                           {"compression_fraction_of_prefill", median(pm.frac)},
                           {"decode_tokens_per_s", median(pm.dec)},
                           {"decode_speedup_vs_full", median(pm.speedup)},
                           {"compression_s_reps", pm.comp_s},
                           {"decode_tokens_per_s_reps", pm.dec},
                           {"last", pm.last}});
        if (!pm.prefill_s.empty()) {
            results.back()["prefill_s"] = median(pm.prefill_s);
            results.back()["prefill_s_reps"] = pm.prefill_s;
        }
    }
    nlohmann::json j;
    j["params"] = a.engine.to_json();
    j["params"].update({{"context", a.context},
                        {"ratio", a.ratio},
                        {"reps", a.reps},
                        {"n_decode", a.n_decode},
                        {"statistic", "median"},
                        {"preset", a.preset},
                        {"prefill_per_method", a.prefill_per_method},
                        {"context_file", !a.tokens_file.empty()   ? "token ids from " + a.tokens_file
                                         : a.context_file.empty() ? std::string("random token ids (seed 1234)")
                                                                  : a.context_file}});
    j["prefill_s"] = median(m.prefill_s);
    j["prefill_s_reps"] = m.prefill_s;
    j["full_decode_tokens_per_s"] = median(m.full_decode);
    j["full_decode_tokens_per_s_reps"] = m.full_decode;
    j["results"] = results;
    return j;
}

int run_bench_methods(const BenchMethodsArgs & a) {
    Loaded l = load(a.model, a.kernels.options(a.threads));
    std::vector<std::string> names = a.methods;
    const bool all = names.size() == 1 && names[0] == "all";
    if (all) {
        names.clear();
        for (const MethodInfo & m : press_methods()) names.push_back(m.name);
    }
    auto params = parse_method_params(a.params, names);
    if (all)  // every method that can run here: kvzap only with a trained scorer
        std::erase_if(names, [&](const std::string & n) {
            try {
                make_press(n, apply_preset(a.preset, n, params.count(n) ? params.at(n) : ParamMap{}), *l.model);
                return false;
            } catch (const Error & e) {
                std::fprintf(stderr, "[bench] skipping %s: %s\n", n.c_str(), e.what());
                return true;
            }
        });
    std::vector<MethodRequest> methods;
    for (const std::string & n : names)
        methods.push_back({n, apply_preset(a.preset, n, params.count(n) ? params.at(n) : ParamMap{})});
    const std::vector<int32_t> toks = bench_tokens(a, l);
    Engine engine(*l.model, a.engine.options());
    const Measurements m = measure(a, engine, *l.tok, methods, toks);
    if (!a.json) {
        print_table(a, methods, m);
        return 0;
    }
    nlohmann::json j = to_json(a, methods, m);
    j["params"]["threads"] = l.model->n_threads();
    j["provenance"] = provenance(*l.model, *l.tok);
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
}

const CommandRegistrar reg("bench-methods", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "bench-methods",
        "Benchmark every compression method on one context: compression time vs prefill, decode speed vs full cache");
    auto a = std::make_shared<BenchMethodsArgs>();
    add_model_arg(cmd, a->model);
    cmd->add_option("--context", a->context, "context tokens")->check(CLI::PositiveNumber);
    auto * text = cmd->add_option("--context-file", a->context_file,
                                  "take the context from this text (default: random token ids)")
                      ->check(CLI::ExistingFile);
    cmd->add_option("--tokens", a->tokens_file, "take the context's token ids from this JSON array")
        ->check(CLI::ExistingFile)
        ->excludes(text);
    cmd->add_option("--dump-plans", a->dump_plans,
                    "write each method's kept rows (first repetition) to DIR/METHOD.json");
    cmd->add_option("--ratio", a->ratio, "compression ratio")->check(CLI::Range(0.0, 0.999));
    add_list_option(cmd, "--methods", a->methods, "method names, or all");
    add_param_option(cmd, a->params, true);
    add_preset_option(cmd, a->preset);
    cmd->add_option("--reps", a->reps, "repetitions (medians are reported)")->check(CLI::PositiveNumber);
    cmd->add_option("--decode", a->n_decode, "tokens decoded from each cache")->check(CLI::PositiveNumber);
    cmd->add_flag("--prefill-per-method", a->prefill_per_method,
                  "each method prefills the context itself, observed by it alone (its result's prefill_s); "
                  "the top-level prefill_s is then a prefill observed by no method");
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    add_json_flag(cmd, a->json, "the results, every repetition and the provenance");
    cmd->callback([&rc, a] { rc = run_bench_methods(*a); });
});
}  // namespace

}  // namespace kvlab::cli
