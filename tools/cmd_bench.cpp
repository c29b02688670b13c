// kvlab bench MODEL: kvlab and libllama side by side in one run, same GGUF and threads:
// prefill tokens/s at each context length and decode tokens/s on top of that context,
// medians of interleaved repetitions, and the ratios kvlab / llama.cpp.
#include <algorithm>
#include <cstdio>
#include <random>

#include "bandwidth.h"
#include "common.h"
#include "instructions.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"
#include "llama_bench.h"
#include "llama_ref.h"

namespace kvlab::cli {

namespace {
struct BenchArgs {
    std::string model;
    std::vector<int> contexts = {512, 4096};
    int reps = 5, n_decode = 32, threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
    bool json = false, instructions = false;
};

int run_bench(const BenchArgs & a) {
    const int threads = resolve_threads(a.threads);
    Loaded l = load(a.model, a.kernels.options(threads));
    const int max_ctx = *std::max_element(a.contexts.begin(), a.contexts.end());
    if (max_ctx + a.n_decode > l.model->hparams().n_ctx_train)
        throw Error("bench", "context " + std::to_string(max_ctx) + " + decode exceeds the model's " +
                                 std::to_string(l.model->hparams().n_ctx_train) + " tokens");
    const EngineOptions eo = a.engine.options();
    Engine engine(*l.model, eo);
    LlamaRef ref(l.path, threads, max_ctx + a.n_decode + 16, a.engine.chunk, true, eo.cache_types);
    std::mt19937 rng(1234);
    nlohmann::json results = nlohmann::json::array();
    const bool anchor = !llama_bench_path().empty();
    // the machine's read bandwidth with the bench's threads (the decode bound below)
    const double bandwidth = measure_read_bandwidth(threads);
    if (!anchor)
        std::fprintf(stderr, "[bench] llama-bench is not built (scripts/deps.sh builds it): its column is left out\n");
    if (!a.json)
        std::printf("%-8s %-16s %10s %10s %12s %9s %9s\n", "context", "measure", "kvlab", "libllama", "llama-bench",
                    "/libllama", "/l-bench");
    for (int n_ctx : a.contexts) {
        // real token ids drawn from the vocabulary (speed does not depend on the text)
        std::vector<int32_t> toks(n_ctx);
        std::uniform_int_distribution<int32_t> dist(0, l.model->hparams().n_vocab - 1);
        for (auto & t : toks) t = dist(rng);
        std::vector<double> kp, kd, rp, rd;
        uint64_t step_bytes = 0;  // what one decode step reads, at the middle of the decode
        for (int rep = 0; rep < a.reps; ++rep) {
            if (!a.json) std::fprintf(stderr, "\r[bench] context %d: repetition %d/%d", n_ctx, rep + 1, a.reps);
            {
                KvStore cache = engine.new_cache(n_ctx + a.n_decode);
                PrefillStats ps;
                engine.prefill(cache, toks, &ps);
                kp.push_back(double(n_ctx) / ps.seconds);
                GenerateOptions go;
                go.max_tokens = a.n_decode + 1;
                go.stop_on_eog = false;
                // one query token, then n_decode single-token steps
                const uint64_t before = decode_bytes_per_token(*l.model, cache);
                GenerateResult r = engine.generate(cache, {toks[0]}, go);
                kd.push_back(r.decode_tokens_per_second());
                step_bytes = (before + decode_bytes_per_token(*l.model, cache)) / 2;
            }
            rp.push_back(double(n_ctx) / ref.time_prefill(toks));
            ref.decode({toks[0]}, false);
            rd.push_back(double(a.n_decode) / ref.time_decode(toks[1], a.n_decode));
        }
        // llama.cpp's own tool, same GGUF, threads and ubatch: prefill of n_ctx tokens, and
        // n_decode tokens on top of a context of n_ctx (its -d)
        std::vector<double> bp, bd;
        if (anchor) {
            if (!a.json) std::fprintf(stderr, "\r[bench] context %d: llama-bench          ", n_ctx);
            const std::string &ctk = a.engine.cache_type_k, &ctv = a.engine.cache_type_v;
            bp = run_llama_bench(l.path, {n_ctx, 0, 0, threads, a.engine.chunk, a.reps, ctk, ctv});
            bd = run_llama_bench(l.path, {0, a.n_decode, n_ctx, threads, a.engine.chunk, a.reps, ctk, ctv});
        }
        if (!a.json) std::fprintf(stderr, "\n");
        auto row = [&](const char * measure, const char * key, const std::vector<double> & k,
                       const std::vector<double> & r, const std::vector<double> & b) {
            const double mk = median(k), mr = median(r), mb = b.empty() ? 0.0 : median(b);
            nlohmann::json j = {{"context", n_ctx}, {"measure", key},  {"kvlab", mk},        {"llama_cpp", mr},
                                {"ratio", mk / mr}, {"kvlab_reps", k}, {"llama_cpp_reps", r}};
            if (!b.empty()) {
                j["llama_bench"] = mb;
                j["llama_bench_reps"] = b;
                j["ratio_llama_bench"] = mk / mb;
            }
            results.push_back(j);
            if (!a.json) {
                char lb[32] = "-", rb[32] = "-";
                if (!b.empty()) {
                    std::snprintf(lb, sizeof lb, "%.1f", mb);
                    std::snprintf(rb, sizeof rb, "%.3f", mk / mb);
                }
                std::printf("%-8d %-16s %10.1f %10.1f %12s %9.3f %9s\n", n_ctx, measure, mk, mr, lb, mk / mr, rb);
                std::fflush(stdout);
            }
        };
        row("prefill tok/s", "prefill_tokens_per_s", kp, rp, bp);
        row("decode tok/s", "decode_tokens_per_s", kd, rd, bd);
        // the bandwidth bound of decode: every byte a step reads, at the measured read bandwidth
        const double bound = bandwidth / double(step_bytes);
        nlohmann::json jb = {{"context", n_ctx},
                             {"measure", "decode_bandwidth_bound"},
                             {"bytes_per_token", step_bytes},
                             {"read_bandwidth_bytes_per_s", bandwidth},
                             {"bound_tokens_per_s", bound},
                             {"kvlab_fraction", median(kd) / bound}};
        if (!bd.empty()) jb["llama_bench_fraction"] = median(bd) / bound;
        results.push_back(jb);
        if (!a.json) {
            std::printf("%-8d %-16s %10.1f  (%.1f MB per step at %.1f GB/s read): kvlab %.0f%%", n_ctx, "decode bound",
                        bound, double(step_bytes) / 1e6, bandwidth / 1e9, 100.0 * median(kd) / bound);
            if (!bd.empty()) std::printf(", llama-bench %.0f%%", 100.0 * median(bd) / bound);
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    nlohmann::json instr;
    if (a.instructions) {
        const InstructionRun ir{512, a.engine.chunk, a.engine.attention};
        if (!a.json) std::fprintf(stderr, "[bench] instruction counts: callgrind on the x86-64-v3 build (minutes)\n");
        const InstructionCounts c = count_instructions(l.path, ir);
        instr = to_json(c, ir);
        if (!a.json)
            std::printf(
                "instructions (callgrind, x86-64-v3 build, 1 thread): prefill of 512 tokens %llu, "
                "one decode step at 512 %llu\n",
                static_cast<unsigned long long>(c.prefill), static_cast<unsigned long long>(c.decode_step));
    }
    if (a.json) {
        nlohmann::json j = {{"results", results},
                            {"params",
                             {{"reps", a.reps},
                              {"n_decode", a.n_decode},
                              {"threads", threads},
                              {"chunk_size", a.engine.chunk},
                              {"attention", a.engine.attention},
                              {"cache_type_k", a.engine.cache_type_k},
                              {"cache_type_v", a.engine.cache_type_v},
                              {"statistic", "median"},
                              {"llama_cpp_flash_attn", true},
                              {"llama_bench", anchor ? llama_bench_path() : ""},
                              {"llama_bench_note",
                               "a separate process, run after each context's interleaved kvlab / "
                               "libllama repetitions; decode at depth = its -d"}}},
                            {"provenance", provenance(*l.model, *l.tok)}};
        if (!instr.is_null()) j["instructions"] = instr;
        std::printf("%s\n", j.dump(2).c_str());
    }
    return 0;
}
const CommandRegistrar reg("bench", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand("bench", "Benchmark kvlab against libllama side by side: prefill and decode speed");
    auto a = std::make_shared<BenchArgs>();
    add_model_arg(cmd, a->model);
    add_list_option(cmd, "--contexts", a->contexts, "context lengths in tokens")->check(CLI::PositiveNumber);
    cmd->add_option("--reps", a->reps, "repetitions (the median is reported)")->check(CLI::PositiveNumber);
    cmd->add_option("--decode", a->n_decode, "tokens decoded on top of each context")->check(CLI::PositiveNumber);
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    add_json_flag(cmd, a->json, "the results, every repetition and the provenance");
    cmd->add_flag("--instructions", a->instructions,
                  "also count the instructions (callgrind) of one 512-token prefill and one decode step: "
                  "deterministic, for regressions on a noisy machine (needs scripts/build-callgrind.sh)");
    cmd->callback([&rc, a] { rc = run_bench(*a); });
});

}  // namespace

}  // namespace kvlab::cli
