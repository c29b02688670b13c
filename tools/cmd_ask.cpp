// kvlab ask MODEL --context-file F -q Q [-q Q ...] [--method NAME (--ratio R | --budget B)]:
// the seed flow on the command line: prefill the context once, compress its cache once,
// answer each question from an independent copy, with every timing and the cache's bytes.
// kvlab ask MODEL --cache doc.kvc -q Q ...: the same answers from a cache file that
// `kvlab compress` wrote (no prefill, no compression).
#include <algorithm>
#include <cstdio>

#include "common.h"
#include "kvlab/cache_file.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {

struct AskArgs {
    std::string model, context_file, cache, system, method = "none", preset;
    std::vector<std::string> questions, params;
    BudgetArgs budget;
    bool query_aware = false, json = false, no_stop = false;
    int max_tokens = 64, threads = 0;
    KernelArgs kernels;
    EngineArgs engine;
    DecodeArgs decode;
};

// "N rows in every (layer, head)", or per layer, or per layer and head where heads differ.
std::string describe_kept(const std::vector<std::vector<int64_t>> & kept) {
    bool heads_equal = true, all_equal = true;
    for (const auto & layer : kept)
        for (int64_t n : layer) {
            heads_equal = heads_equal && n == layer[0];
            all_equal = all_equal && n == kept[0][0];
        }
    if (all_equal) return std::to_string(kept[0][0]) + " rows in every (layer, head)";
    std::string s = heads_equal ? "per layer:" : "per layer [per head]:";
    for (const auto & layer : kept) {
        if (heads_equal) {
            s += " " + std::to_string(layer[0]);
            continue;
        }
        s += " [";
        for (size_t h = 0; h < layer.size(); ++h) s += (h ? " " : "") + std::to_string(layer[h]);
        s += "]";
    }
    return s;
}

class Ask {
public:
    explicit Ask(const AskArgs & a) : a_(a) {}

    int run() {
        if (!a_.cache.empty()) return run_from_file();
        if (a_.context_file.empty()) throw Error("ask", "give the context: --context-file F or --cache FILE.kvc");
        const bool compressing = a_.method != "none";
        if (!compressing && (a_.budget.any() || !a_.params.empty()))
            throw Error("ask",
                        "a budget (--ratio, --budget, --kv-bytes, --bytes-ratio, --demote) and --param need --method "
                        "(see `kvlab "
                        "methods`)");
        if (compressing && !a_.budget.given())
            throw Error("ask", "--method " + a_.method +
                                   " needs a budget: --ratio R, --budget B, --kv-bytes N or --bytes-ratio R");
        l_ = load(a_.model, a_.kernels.options(a_.threads));
        if (compressing) {
            methods_ = {{a_.method, apply_preset(a_.preset, a_.method, parse_params(a_.params))}};
            budget_ = a_.budget.budget();
        }
        const std::string context = read_file(a_.context_file);
        for (const std::string & q : a_.questions)
            queries_.push_back(
                split_query(l_.tok->context_chat(before(a_.system), context, {{"user", q}}), a_.query_aware));
        start_answering();

        reset_peak_rss();
        if (!a_.query_aware) {
            answer_from_one_context(queries_[0].context, 0, queries_.size());
        } else {  // each question joins its own copy of the context before compression
            for (size_t qi = 0; qi < queries_.size(); ++qi) answer_from_one_context(queries_[qi].context, qi, qi + 1);
        }
        print_summary();
        return 0;
    }

private:
    static std::vector<ChatMessage> before(const std::string & system) {
        return system.empty() ? std::vector<ChatMessage>{} : std::vector<ChatMessage>{{"system", system}};
    }

    // Answers every question from the cache file: no prefill, no compression.
    int run_from_file() {
        if (!a_.context_file.empty() || a_.method != "none" || a_.budget.any() || !a_.params.empty() ||
            !a_.preset.empty() || a_.query_aware || !a_.system.empty())
            throw Error("ask",
                        "--cache answers from the file as it was made: --context-file, --system, --method, "
                        "--ratio, --budget, --param, --preset and --query-aware do not apply");
        l_ = load(a_.model, a_.kernels.options(a_.threads));
        start_answering();
        // The query tokens first, from the file's text and the messages before it (META, TEXT
        // and TOKN only): the store is then read with the reserve they need.
        CacheFileContent content;
        read_cache_file_meta(a_.cache, &content);
        if (content.text.empty())
            throw Error("ask", a_.cache + " was made from token ids, not text: its questions cannot be templated");
        int64_t max_query = 0;
        for (const std::string & q : a_.questions) {
            const Tokenizer::SplitPrompt sp =
                l_.tok->context_chat(context_before(content.context), content.text, {{"user", q}});
            if (sp.context != content.tokens)
                throw Error("ask", a_.cache + ": this tokenizer does not reproduce the file's context tokens");
            queries_.push_back({sp.context, sp.query});
            max_query = std::max<int64_t>(max_query, int64_t(sp.query.size()));
        }
        reset_peak_rss();
        const LoadedCacheFile f = load_cache_file(a_.cache, *l_.model, max_query + growth());
        if (f.content.tokens != content.tokens) throw Error("ask", a_.cache + " changed while it was read");
        const nlohmann::json & ctx = f.content.context;
        method_params_ = ctx.value("params", nlohmann::json::object());
        log("[cache]    %s: %lld context tokens, method %s, %s of KV rows; read %s in %.3f s (%.2f GB/s: read %.3f s, "
            "verify %.3f s, build %.3f s)\n",
            a_.cache.c_str(), static_cast<long long>(f.content.tokens.size()), ctx.value("method", "?").c_str(),
            human_bytes(f.cache.used_bytes()).c_str(), human_bytes(f.file_bytes).c_str(), f.seconds(),
            double(f.file_bytes) / f.seconds() / 1e9, f.read_s, f.verify_s, f.build_s);
        prepared_json_.push_back({{"cache_file", a_.cache},
                                  {"context_tokens", f.content.tokens.size()},
                                  {"file_bytes", f.file_bytes},
                                  {"load_s", f.seconds()},
                                  {"load", {{"read_s", f.read_s}, {"verify_s", f.verify_s}, {"build_s", f.build_s}}},
                                  {"kv_bytes", f.cache.used_bytes()},
                                  {"made", ctx}});
        ContextSession s(*engine_, {}, SessionOptions{max_query, growth()});
        for (size_t qi = 0; qi < queries_.size(); ++qi) answer(qi, s, f.cache);
        print_summary();
        return 0;
    }

    // The engine, the generation options and the decoding policy every answer uses.
    void start_answering() {
        engine_ = std::make_unique<Engine>(*l_.model, a_.engine.options());
        go_.max_tokens = a_.max_tokens;
        go_.stop_on_eog = !a_.no_stop;
        go_.eog_ids = l_.tok->eog_ids();
        decode_ = a_.decode.options();
        policy_ = std::make_unique<DecodePolicy>(decode_, *l_.model);
        go_.decode = &policy_->hook();
    }

    // Rows an answer adds to its copy of the cache (its reserve beyond the query).
    int64_t growth() const { return decode_growth(decode_, a_.max_tokens); }

    template <typename... Args>
    void log(const char * fmt, Args... args) const {
        if (!a_.json) std::fprintf(stderr, fmt, args...);
    }

    // One session: prefill, compress (or fit the full cache), answer questions [q0, q1).
    void answer_from_one_context(const std::vector<int32_t> & context, size_t q0, size_t q1) {
        int64_t max_query = 0;
        for (size_t qi = q0; qi < q1; ++qi)
            max_query = std::max<int64_t>(max_query, int64_t(queries_[qi].query.size()));
        ContextSession s(*engine_, methods_, SessionOptions{max_query, growth(), l_.tok.get()});
        if (!methods_.empty()) method_params_ = s.press(0).params();
        log("[prefill]  %zu context tokens ...\n", context.size());
        s.prefill(context);
        const PrefillStats & ps = s.prefill_stats();
        const double observing = methods_.empty() ? 0.0 : s.observe_seconds(0);
        log("[prefill]  %.3f s (%.1f tok/s)%s\n", ps.seconds, ps.tokens_per_second(),
            observing > 0 ? (" + " + std::to_string(observing) + " s of scoring inside the prefill").c_str() : "");
        const PreparedCache p = methods_.empty() ? s.full() : s.compress(0, budget_);
        report_compression(p, ps);
        prepared_json_.push_back({{"context_tokens", ps.n_tokens},
                                  {"prefill_s", ps.seconds},
                                  {"prefill_tokens_per_s", ps.tokens_per_second()},
                                  {"reserve", s.reserve()},
                                  {"compression", p.stats.to_json()},
                                  {"compression_fraction_of_prefill", p.stats.seconds() / ps.seconds}});
        for (size_t qi = q0; qi < q1; ++qi) answer(qi, s, p.cache);
    }

    void report_compression(const PreparedCache & p, const PrefillStats & ps) const {
        const CompressStats & c = p.stats;
        if (!methods_.empty())
            log("[compress] %s %s: %.3f s = %.1f%% of prefill (scoring during prefill %.3f s, plan %.3f s, apply "
                "%.3f s)\n",
                a_.method.c_str(), budget_.describe().c_str(), c.seconds(), 100.0 * c.seconds() / ps.seconds,
                c.observe_s, c.plan_s, c.apply_s);
        log("[cache]    allocated %s -> %s, used %s -> %s; kept %s\n", human_bytes(c.bytes_before).c_str(),
            human_bytes(c.bytes_after).c_str(), human_bytes(c.used_before).c_str(), human_bytes(c.used_after).c_str(),
            describe_kept(c.kept).c_str());
        const KvStore & kv = p.cache;
        bool sliding = false;
        for (int il = 0; il < kv.n_layer(); ++il) sliding = sliding || kv.window(il) > 0;
        if (!sliding) return;
        // per layer kind: rows held and bytes allocated (F16 K + V), the largest layer of each
        for (int kind = 0; kind < 2; ++kind) {
            int n = 0;
            int64_t rows = 0, cap = 0;
            for (int il = 0; il < kv.n_layer(); ++il) {
                if ((kv.window(il) > 0) != (kind == 0)) continue;
                ++n;
                int64_t r = 0, c = 0;
                for (int h = 0; h < kv.n_head_kv(); ++h) {
                    r += kv.n_rows(il, h);
                    c += kv.capacity(il, h);
                }
                rows = std::max(rows, r);
                cap = std::max(cap, c);
            }
            if (n == 0) continue;
            log("[cache]    %d %s layers: at most %lld rows, %s allocated each%s\n", n,
                kind == 0 ? "sliding-window" : "global", static_cast<long long>(rows),
                human_bytes(uint64_t(cap) * kv.row_bytes()).c_str(),
                kind == 0 ? " (bounded at any context length)" : "");
        }
    }

    void answer(size_t qi, const ContextSession & s, const KvStore & cache) {
        const std::vector<int32_t> & query = queries_[qi].query;
        policy_->start(cache);
        const GenerateResult r = s.answer(cache, query, go_);
        const std::string text = l_.tok->decode(r.tokens);
        log("\nQ%zu: %s\nA%zu: %s\n", qi + 1, a_.questions[qi].c_str(), qi + 1, text.c_str());
        log("    TTFT %.3f s (%zu query tokens) | decode %lld tok in %.3f s (%.1f tok/s) | stop: %s\n", r.ttft_s,
            query.size(), static_cast<long long>(r.n_decoded), r.decode_s, r.decode_tokens_per_second(),
            r.stop_reason.c_str());
        const DecodePolicy::Stats & ds = policy_->stats();
        if (decode_.method != "none")
            log("    decoding: %s, %lld compactions, %lld rows dropped; KV at most %s allocated\n",
                decode_.method.c_str(), static_cast<long long>(ds.compactions), static_cast<long long>(ds.rows_dropped),
                human_bytes(r.kv_peak_bytes).c_str());
        answers_json_.push_back({{"question", a_.questions[qi]},
                                 {"answer", text},
                                 {"tokens", r.tokens},
                                 {"query_tokens", query.size()},
                                 {"stop_reason", r.stop_reason},
                                 {"ttft_s", r.ttft_s},
                                 {"decode_s", r.decode_s},
                                 {"decode_tokens", r.n_decoded},
                                 {"decode_tokens_per_s", r.decode_tokens_per_second()},
                                 {"kv_peak_bytes", r.kv_peak_bytes},
                                 {"decode_policy", ds.to_json()}});
    }

    void print_summary() const {
        if (!a_.json) {
            const MemInfo mi = mem_info();
            std::fprintf(stderr, "\n[memory]   weights %s | compute %s | RSS %s, peak %s\n",
                         human_bytes(l_.model->weight_bytes()).c_str(), human_bytes(engine_->compute_bytes()).c_str(),
                         human_bytes(mi.rss_bytes).c_str(), human_bytes(mi.peak_rss_bytes).c_str());
            return;
        }
        const bool compressing = !methods_.empty();
        nlohmann::json j;
        j["context_file"] = a_.context_file;
        j["cache_file"] = a_.cache;
        j["method"] = a_.method;
        j["budget"] = compressing ? budget_.to_json() : nlohmann::json();
        j["method_params"] = method_params_;
        j["query_aware"] = a_.query_aware;
        j["preset"] = a_.preset;
        j["decode_policy"] = decode_.to_json();
        j["prepared"] = prepared_json_;
        j["answers"] = answers_json_;
        j["memory"] = memory_json(*l_.model, nullptr, engine_.get());
        j["params"] = a_.engine.to_json();
        j["params"].update(
            {{"max_tokens", a_.max_tokens}, {"threads", l_.model->n_threads()}, {"stop_on_eog", !a_.no_stop}});
        j["provenance"] = provenance(*l_.model, *l_.tok);
        std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }

    const AskArgs & a_;
    Loaded l_;
    std::vector<MethodRequest> methods_;
    Budget budget_;
    std::vector<ContextQuery> queries_;
    std::unique_ptr<Engine> engine_;
    GenerateOptions go_;
    DecodePolicyOptions decode_;
    std::unique_ptr<DecodePolicy> policy_;
    nlohmann::json answers_json_ = nlohmann::json::array(), prepared_json_ = nlohmann::json::array();
    nlohmann::json method_params_ = nlohmann::json::object();  // resolved (defaults filled in)
};

const CommandRegistrar reg("ask", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "ask", "Prefill a context once, compress its KV cache once, answer each question from an independent copy");
    auto a = std::make_shared<AskArgs>();
    add_model_arg(cmd, a->model);
    auto * ctx =
        cmd->add_option("--context-file", a->context_file, "the long context (a text file)")->check(CLI::ExistingFile);
    cmd->add_option("--cache", a->cache, "answer from a cache file written by `kvlab compress` instead")
        ->check(CLI::ExistingFile)
        ->excludes(ctx);
    cmd->add_option("--system", a->system, "a system message before the context");
    cmd->add_option("-q,--question", a->questions, "a question about the context (repeatable)")->required();
    cmd->add_option("--method", a->method, "compression method (`kvlab methods`), or none for the full cache");
    add_budget_options(cmd, a->budget);
    add_param_option(cmd, a->params, false);
    add_preset_option(cmd, a->preset);
    cmd->add_flag("--query-aware", a->query_aware,
                  "append each question to the context before compressing (one prefill and compression per question)");
    cmd->add_option("-n,--max-tokens", a->max_tokens, "most tokens per answer")->check(CLI::PositiveNumber);
    add_run_options(cmd, a->threads, a->kernels, a->engine);
    cmd->add_flag("--no-stop", a->no_stop, "do not stop at end-of-generation tokens");
    add_decode_policy_options(cmd, a->decode);
    add_json_flag(cmd, a->json, "the answers, timings, bytes, kept rows and provenance");
    cmd->callback([&rc, a] { rc = Ask(*a).run(); });
});

}  // namespace

}  // namespace kvlab::cli
