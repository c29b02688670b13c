// kvlab generate MODEL (--prompt TEXT | --prompt-file F | --chat TEXT) ...: a fresh prefill
// and generation, with every timing and memory figure.
#include <cstdio>

#include "common.h"
#include "kvlab/decode_policy.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {
struct GenerateArgs {
    std::string model, prompt, prompt_file, chat;
    int max_tokens = 128, top_k = 0, threads = 0, logprobs = 0;
    KernelArgs kernels;
    EngineArgs engine;
    float temp = 0.0f, top_p = 1.0f;
    uint64_t seed = 0;
    bool json = false, no_stop = false;
    DecodeArgs decode;
};

int run_generate(const GenerateArgs & a) {
    Loaded l = load(a.model, a.kernels.options(a.threads));
    std::vector<int32_t> prompt;
    if (!a.chat.empty())
        prompt = l.tok->chat({{"user", a.chat}});
    else if (!a.prompt_file.empty())
        prompt = l.tok->encode(read_file(a.prompt_file));
    else
        prompt = l.tok->encode(a.prompt);
    const int64_t n_ctx = l.model->hparams().n_ctx_train;
    if (int64_t(prompt.size()) >= n_ctx)
        throw Error("generate", "the prompt has " + std::to_string(prompt.size()) +
                                    " tokens, more than the model's context of " + std::to_string(n_ctx) + " allows");

    Engine engine(*l.model, a.engine.options());
    const DecodePolicyOptions dopts = a.decode.options();
    DecodePolicy policy(dopts, *l.model);
    // with a decoding policy the cache grows by at most its interval between compactions
    const int64_t growth = decode_growth(dopts, a.max_tokens);
    KvStore cache = engine.new_cache(std::min<int64_t>(n_ctx, int64_t(prompt.size()) + growth));
    GenerateOptions go;
    go.max_tokens = a.max_tokens;
    go.stop_on_eog = !a.no_stop;
    go.eog_ids = l.tok->eog_ids();
    go.sampling = {a.temp, a.top_k, a.top_p, a.seed};
    go.n_logprobs = a.logprobs;
    policy.start(cache);
    go.decode = &policy.hook();
    if (!a.json)
        std::fprintf(stderr, "[generate] %zu prompt tokens, up to %d new tokens\n", prompt.size(), a.max_tokens);
    reset_peak_rss();
    GenerateResult r = engine.generate(cache, prompt, go, [&](int32_t t) {
        if (!a.json) {
            std::fputs(l.tok->piece(t).c_str(), stdout);
            std::fflush(stdout);
        }
        return true;
    });
    const std::string text = l.tok->decode(r.tokens);
    const double prefill_tps = r.query_prefill_s > 0 ? double(prompt.size()) / r.query_prefill_s : 0.0;
    if (a.json) {
        nlohmann::json j;
        j["text"] = text;
        j["prompt_tokens"] = prompt.size();
        j["tokens"] = r.tokens;
        j["stop_reason"] = r.stop_reason;
        if (a.logprobs > 0) {
            auto & lp = j["logprobs"] = nlohmann::json::array();
            for (const auto & t : r.logprobs) {
                nlohmann::json top = nlohmann::json::array();
                for (const auto & [id, v] : t.top)
                    top.push_back({{"token", id}, {"piece", l.tok->piece(id)}, {"logprob", v}});
                lp.push_back({{"token", t.token}, {"logprob", t.logprob}, {"top", top}});
            }
        }
        j["timings"] = {{"load_s", l.model->load_seconds()},
                        {"prefill_s", r.query_prefill_s},
                        {"prefill_tokens_per_s", prefill_tps},
                        {"ttft_s", r.ttft_s},
                        {"decode_s", r.decode_s},
                        {"decode_tokens", r.n_decoded},
                        {"decode_tokens_per_s", r.decode_tokens_per_second()}};
        j["memory"] = memory_json(*l.model, &cache, &engine);
        j["decode_policy"] = dopts.to_json();
        j["decode_policy"].update(policy.stats().to_json());
        j["memory"]["kv_peak_bytes"] = r.kv_peak_bytes;
        j["params"] = a.engine.to_json();
        j["params"].update({{"max_tokens", a.max_tokens},
                            {"temp", a.temp},
                            {"top_k", a.top_k},
                            {"top_p", a.top_p},
                            {"seed", a.seed},
                            {"stop_on_eog", !a.no_stop}});
        j["provenance"] = provenance(*l.model, *l.tok);
        std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        return 0;
    }
    const MemInfo mi = mem_info();
    std::printf("\n");
    std::fprintf(stderr,
                 "[generate] stop: %s; %zu tokens\n"
                 "[timing]   load %.3f s | prefill %zu tok in %.3f s (%.1f tok/s) | TTFT %.3f s | decode %lld tok in "
                 "%.3f s (%.1f tok/s)\n"
                 "[memory]   weights %s | KV %s allocated, %s used | compute %s | RSS %s, peak %s\n",
                 r.stop_reason.c_str(), r.tokens.size(), l.model->load_seconds(), prompt.size(), r.query_prefill_s,
                 prefill_tps, r.ttft_s, static_cast<long long>(r.n_decoded), r.decode_s, r.decode_tokens_per_second(),
                 human_bytes(l.model->weight_bytes()).c_str(), human_bytes(cache.bytes()).c_str(),
                 human_bytes(cache.used_bytes()).c_str(), human_bytes(engine.compute_bytes()).c_str(),
                 human_bytes(mi.rss_bytes).c_str(), human_bytes(mi.peak_rss_bytes).c_str());
    if (dopts.method != "none") {
        const DecodePolicy::Stats & ds = policy.stats();
        std::fprintf(stderr,
                     "[decode]   %s: %lld compactions, %lld rows dropped in %.3f s; at most %lld rows per segment, "
                     "KV at most %s allocated\n",
                     dopts.method.c_str(), static_cast<long long>(ds.compactions),
                     static_cast<long long>(ds.rows_dropped), ds.seconds, static_cast<long long>(ds.max_segment_rows),
                     human_bytes(ds.max_bytes).c_str());
    }
    return 0;
}
const CommandRegistrar reg("generate", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand("generate", "Prefill a prompt and generate, reporting TTFT, speeds and memory");
    auto a = std::make_shared<GenerateArgs>();
    add_model_arg(cmd, a->model);
    auto * g = cmd->add_option_group("prompt", "exactly one of");
    g->add_option("-p,--prompt", a->prompt, "the prompt text (no chat template)");
    g->add_option("-f,--prompt-file", a->prompt_file, "read the prompt from a file")->check(CLI::ExistingFile);
    g->add_option("--chat", a->chat, "a user message, wrapped in the model's chat template");
    g->require_option(1);
    cmd->add_option("-n,--max-tokens", a->max_tokens, "most tokens to generate")->check(CLI::PositiveNumber);
    cmd->add_option("--temp", a->temp, "sampling temperature; 0 is greedy")->check(CLI::NonNegativeNumber);
    cmd->add_option("--top-k", a->top_k, "keep the k most likely tokens; 0 keeps all")->check(CLI::NonNegativeNumber);
    cmd->add_option("--top-p", a->top_p, "nucleus sampling mass; 1 keeps all")->check(CLI::Range(0.0f, 1.0f));
    cmd->add_option("-s,--seed", a->seed, "sampling seed");
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    cmd->add_option("--logprobs", a->logprobs, "with --json: top-K log-probabilities at each generated position")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--no-stop", a->no_stop, "do not stop at end-of-generation tokens");
    add_decode_policy_options(cmd, a->decode);
    add_json_flag(cmd, a->json, "the text, token ids, timings, memory and provenance");
    cmd->callback([&rc, a] { rc = run_generate(*a); });
});

}  // namespace

}  // namespace kvlab::cli
