// kvlab bench-methods MODEL: every compression method on one long context: compression
// time as a fraction of the prefill, and decode speed from the compressed cache against
// the full cache; medians of repetitions. One prefill per repetition serves every method
// (their observers run side by side; each method's scoring time is its own).
#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

#include "common.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {
struct BenchMethodsArgs {
    std::string model, methods = "all", context_file;
    int context = 4096, reps = 3, n_decode = 32, threads = default_threads(), chunk = 512;
    double ratio = 0.875;
    bool json = false;
};

std::vector<std::string> split(const std::string & s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');)
        if (!x.empty()) out.push_back(x);
    return out;
}

// The decode speed from a copy of `cache` (n_decode single-token steps after one token).
double decode_speed(Engine & e, const KvStore & cache, int32_t tok, int n_decode) {
    KvStore work = cache.copy();
    GenerateOptions go;
    go.max_tokens = n_decode + 1;
    go.stop_on_eog = false;
    return e.generate(work, {tok}, go).decode_tokens_per_second();
}

int run_bench_methods(const BenchMethodsArgs & a) {
    Loaded l = load(a.model, a.threads);
    const Budget budget = Budget::from_ratio(a.ratio);
    std::vector<std::string> names;
    if (a.methods == "all") {
        for (const MethodInfo & m : press_methods()) names.push_back(m.name);
    } else {
        names = split(a.methods);
    }
    for (const std::string & n : names) make_press(n, {}, *l.model);  // validate names before the long run
    std::vector<int32_t> toks;
    if (!a.context_file.empty()) {
        toks = l.tok->encode(read_file(a.context_file));
        if (int64_t(toks.size()) < a.context)
            throw Error("bench-methods", a.context_file + " has only " + std::to_string(toks.size()) + " tokens");
        toks.resize(size_t(a.context));
    } else {  // real token ids drawn from the vocabulary (speeds do not depend on the text)
        std::mt19937 rng(1234);
        std::uniform_int_distribution<int32_t> dist(0, l.model->hparams().n_vocab - 1);
        toks.resize(size_t(a.context));
        for (auto & t : toks) t = dist(rng);
    }
    if (a.context + a.n_decode + 2 > l.model->hparams().n_ctx_train)
        throw Error("bench-methods", "context " + std::to_string(a.context) + " exceeds the model's " +
                                         std::to_string(l.model->hparams().n_ctx_train) + " tokens");
    Engine engine(*l.model, EngineOptions{a.chunk});
    const int64_t reserve = a.n_decode + 2;

    std::vector<double> prefill_s, full_decode;
    std::vector<std::vector<double>> comp_s(names.size()), frac(names.size()), dec(names.size()), speedup(names.size());
    std::vector<nlohmann::json> last_stats(names.size());
    for (int rep = 0; rep < a.reps; ++rep) {
        std::vector<std::unique_ptr<Press>> presses;
        for (const std::string & n : names) presses.push_back(make_press(n, {}, *l.model));
        KvStore cache = engine.new_cache(a.context);
        ObserverSet obs(*l.model);
        for (auto & p : presses) obs.add(p->observer(cache, a.context));
        if (!a.json)
            std::fprintf(stderr, "[bench] repetition %d/%d: prefill %d tokens ...\n", rep + 1, a.reps, a.context);
        PrefillStats ps;
        engine.prefill(cache, toks, &ps, nullptr, obs.get());
        double observing = 0.0;
        for (auto & p : presses) observing += p->observe_seconds();
        const double model_s = ps.seconds - observing;
        prefill_s.push_back(model_s);
        {
            KvStore full = cache.copy();
            full.fit(reserve);
            full_decode.push_back(decode_speed(engine, full, toks[0], a.n_decode));
        }
        for (size_t i = 0; i < names.size(); ++i) {
            if (!a.json) std::fprintf(stderr, "\r[bench] repetition %d/%d: %-20s", rep + 1, a.reps, names[i].c_str());
            KvStore c = cache.copy();
            const CompressStats st = compress(*presses[i], c, budget, reserve);
            comp_s[i].push_back(st.seconds());
            frac[i].push_back(st.seconds() / model_s);
            dec[i].push_back(decode_speed(engine, c, toks[0], a.n_decode));
            speedup[i].push_back(dec[i].back() / full_decode.back());
            last_stats[i] = {{"bytes_before", st.bytes_before},
                             {"bytes_after", st.bytes_after},
                             {"rows_before", st.rows_before},
                             {"rows_after", st.rows_after},
                             {"observe_s", st.observe_s},
                             {"plan_s", st.plan_s},
                             {"apply_s", st.apply_s}};
        }
        if (!a.json) std::fprintf(stderr, "\n");
    }
    nlohmann::json results = nlohmann::json::array();
    if (!a.json) {
        std::printf("context %d tokens, ratio %.3f: prefill %.2f s (median of %d), full-cache decode %.1f tok/s\n\n",
                    a.context, a.ratio, median(prefill_s), a.reps, median(full_decode));
        std::printf("%-20s %12s %12s %14s %10s %12s\n", "method", "compress s", "% prefill", "decode tok/s", "vs full",
                    "KV after");
    }
    for (size_t i = 0; i < names.size(); ++i) {
        results.push_back({{"method", names[i]},
                           {"compression_s", median(comp_s[i])},
                           {"compression_fraction_of_prefill", median(frac[i])},
                           {"decode_tokens_per_s", median(dec[i])},
                           {"decode_speedup_vs_full", median(speedup[i])},
                           {"compression_s_reps", comp_s[i]},
                           {"decode_tokens_per_s_reps", dec[i]},
                           {"last", last_stats[i]}});
        if (!a.json)
            std::printf("%-20s %12.3f %11.2f%% %14.1f %9.2fx %12s\n", names[i].c_str(), median(comp_s[i]),
                        100.0 * median(frac[i]), median(dec[i]), median(speedup[i]),
                        human_bytes(last_stats[i]["bytes_after"].get<uint64_t>()).c_str());
    }
    if (a.json) {
        nlohmann::json j;
        j["params"] = {{"context", a.context},
                       {"ratio", a.ratio},
                       {"reps", a.reps},
                       {"n_decode", a.n_decode},
                       {"threads", a.threads},
                       {"chunk_size", a.chunk},
                       {"statistic", "median"},
                       {"context_file", a.context_file.empty() ? "random token ids (seed 1234)" : a.context_file}};
        j["prefill_s"] = median(prefill_s);
        j["prefill_s_reps"] = prefill_s;
        j["full_decode_tokens_per_s"] = median(full_decode);
        j["full_decode_tokens_per_s_reps"] = full_decode;
        j["results"] = results;
        j["provenance"] = provenance(*l.model, *l.tok);
        std::printf("%s\n", j.dump(2).c_str());
    }
    return 0;
}
}  // namespace

void add_bench_methods_command(CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "bench-methods",
        "Benchmark every compression method on one context: compression time vs prefill, decode speed vs full cache");
    auto a = std::make_shared<BenchMethodsArgs>();
    cmd->add_option("MODEL", a->model, "short name or .gguf path")->required();
    cmd->add_option("--context", a->context, "context tokens")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_option("--context-file", a->context_file, "take the context from this text (default: random token ids)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--ratio", a->ratio, "compression ratio")->capture_default_str()->check(CLI::Range(0.0, 0.999));
    cmd->add_option("--methods", a->methods, "comma-separated method names, or all")->capture_default_str();
    cmd->add_option("--reps", a->reps, "repetitions (medians are reported)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--decode", a->n_decode, "tokens decoded from each cache")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--threads", a->threads, "CPU threads")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_option("--chunk", a->chunk, "prefill chunk size")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_flag("--json", a->json, "print the results, every repetition and the provenance as JSON");
    cmd->callback([&rc, a] { rc = run_bench_methods(*a); });
}

}  // namespace kvlab::cli
