// kvlab ask MODEL --context-file F --question Q [--question Q ...] [--method NAME ...]:
// prefill the context once, compress its cache once, answer each question from an
// independent copy (seed flow), with every timing and the cache's bytes.
#include <cstdio>

#include "common.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {

struct AskArgs {
    std::string model, context_file, method = "none", attention = "kvlab";
    std::vector<std::string> questions, params;
    double ratio = -1.0;
    int64_t budget = -1;
    bool query_aware = false, json = false, no_stop = false;
    int max_tokens = 64, threads = default_threads(), chunk = 512;
};

ParamMap parse_params(const std::vector<std::string> & kvs) {
    ParamMap m;
    for (const std::string & kv : kvs) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) throw Error("ask", "--param takes KEY=VALUE, got '" + kv + "'");
        m[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    return m;
}

// "N rows in every segment", or per layer, or per layer and head where heads differ.
std::string describe_kept(const std::vector<std::vector<int64_t>> & kept) {
    bool heads_equal = true, all_equal = true;
    for (const auto & layer : kept)
        for (int64_t n : layer) {
            heads_equal = heads_equal && n == layer[0];
            all_equal = all_equal && n == kept[0][0];
        }
    std::string s;
    if (all_equal) return std::to_string(kept[0][0]) + " rows in every (layer, head)";
    if (heads_equal) {
        s = "per layer:";
        for (const auto & layer : kept) s += " " + std::to_string(layer[0]);
        return s;
    }
    s = "per layer [per head]:";
    for (const auto & layer : kept) {
        s += " [";
        for (size_t h = 0; h < layer.size(); ++h) s += (h ? " " : "") + std::to_string(layer[h]);
        s += "]";
    }
    return s;
}

int run_ask(const AskArgs & a) {
    const bool compressing = a.method != "none";
    if (!compressing && (a.ratio >= 0.0 || a.budget >= 0 || !a.params.empty()))
        throw Error("ask", "--ratio, --budget and --param need --method (see `kvlab methods`)");
    if (compressing && a.ratio < 0.0 && a.budget < 0)
        throw Error("ask", "--method " + a.method + " needs --ratio R or --budget B");
    Loaded l = load(a.model, a.threads);
    const ParamMap pm = parse_params(a.params);
    const Budget budget = !compressing    ? Budget{}
                          : a.budget >= 0 ? Budget::from_tokens(a.budget)
                                          : Budget::from_ratio(a.ratio);
    // validates the method and its parameters before any heavy work
    std::unique_ptr<Press> press = compressing ? make_press(a.method, pm, *l.model) : nullptr;

    const std::string context = read_file(a.context_file);
    std::vector<Tokenizer::SplitPrompt> prompts;
    for (const std::string & q : a.questions) prompts.push_back(l.tok->context_prompt(context, q));
    const std::vector<int32_t> & ctx = prompts[0].context;
    int64_t max_query = 0;
    for (const auto & p : prompts) max_query = std::max<int64_t>(max_query, int64_t(p.query.size()));
    const int64_t n_ctx = l.model->hparams().n_ctx_train;
    const int64_t L = int64_t(ctx.size());
    if (L + max_query + a.max_tokens > n_ctx)
        throw Error("ask", "the context has " + std::to_string(L) + " tokens; with the question (" +
                               std::to_string(max_query) + ") and the answer (" + std::to_string(a.max_tokens) +
                               ") that exceeds the model's context of " + std::to_string(n_ctx) + " tokens");
    const int64_t reserve = max_query + a.max_tokens;

    Engine engine(*l.model, EngineOptions{a.chunk, parse_attention_kernel(a.attention)});
    GenerateOptions go;
    go.max_tokens = a.max_tokens;
    go.stop_on_eog = !a.no_stop;
    go.eog_ids = l.tok->eog_ids();
    auto log = [&](const char * fmt, auto... args) {
        if (!a.json) std::fprintf(stderr, fmt, args...);
    };

    // Prefills `tokens` and compresses (or only reserves room, with --method none).
    struct Prepared {
        KvStore cache;
        PrefillStats prefill;
        CompressStats comp;
    };
    auto prepare = [&](const std::vector<int32_t> & tokens) {
        Prepared p{engine.new_cache(int64_t(tokens.size())), {}, {}};
        const QueryObserver * obs = press ? press->observer(p.cache, int64_t(tokens.size())) : nullptr;
        log("[prefill]  %zu context tokens ...\n", tokens.size());
        engine.prefill(p.cache, tokens, &p.prefill, nullptr, obs);
        const double scoring = press ? press->observe_seconds() : 0.0;
        p.prefill.seconds -= scoring;  // the model's part; the scoring done on the way counts as compression
        log("[prefill]  %.3f s (%.1f tok/s)%s\n", p.prefill.seconds, double(tokens.size()) / p.prefill.seconds,
            scoring > 0 ? (" + " + std::to_string(scoring) + " s of scoring inside the prefill").c_str() : "");
        if (press) {
            p.comp = compress(*press, p.cache, budget, reserve);
        } else {  // the full cache, with the same reserve
            p.comp.rows_before = p.cache.total_rows();
            p.comp.bytes_before = p.cache.bytes();
            p.comp.used_before = p.cache.used_bytes();
            p.cache.fit(reserve);
            p.comp.rows_after = p.cache.total_rows();
            p.comp.bytes_after = p.cache.bytes();
            p.comp.used_after = p.cache.used_bytes();
            p.comp.kept.assign(p.cache.n_layer(), std::vector<int64_t>(p.cache.n_head_kv(), int64_t(tokens.size())));
        }
        return p;
    };
    auto report_compression = [&](const Prepared & p) {
        if (press)
            log("[compress] %s %s: %.3f s = %.1f%% of prefill (scoring during prefill %.3f s, plan %.3f s, apply %.3f "
                "s)\n",
                a.method.c_str(), budget.describe().c_str(), p.comp.seconds(),
                100.0 * p.comp.seconds() / p.prefill.seconds, p.comp.observe_s, p.comp.plan_s, p.comp.apply_s);
        log("[cache]    allocated %s -> %s, used %s -> %s; kept %s\n", human_bytes(p.comp.bytes_before).c_str(),
            human_bytes(p.comp.bytes_after).c_str(), human_bytes(p.comp.used_before).c_str(),
            human_bytes(p.comp.used_after).c_str(), describe_kept(p.comp.kept).c_str());
    };

    nlohmann::json answers = nlohmann::json::array(), prepared_json = nlohmann::json::array();
    auto prepared_to_json = [&](const Prepared & p) {
        return nlohmann::json{{"context_tokens", p.prefill.n_tokens},
                              {"prefill_s", p.prefill.seconds},
                              {"prefill_tokens_per_s", double(p.prefill.n_tokens) / p.prefill.seconds},
                              {"compression", p.comp.to_json()},
                              {"compression_fraction_of_prefill", p.comp.seconds() / p.prefill.seconds}};
    };
    auto answer = [&](size_t qi, KvStore & cache, const std::vector<int32_t> & query) {
        const GenerateResult r = engine.generate(cache, query, go);
        const std::string text = l.tok->decode(r.tokens);
        log("\nQ%zu: %s\nA%zu: %s\n", qi + 1, a.questions[qi].c_str(), qi + 1, text.c_str());
        log("    TTFT %.3f s (%zu query tokens) | decode %lld tok in %.3f s (%.1f tok/s) | stop: %s\n", r.ttft_s,
            query.size(), static_cast<long long>(r.n_decoded), r.decode_s, r.decode_tokens_per_second(),
            r.stop_reason.c_str());
        answers.push_back({{"question", a.questions[qi]},
                           {"answer", text},
                           {"tokens", r.tokens},
                           {"query_tokens", query.size()},
                           {"stop_reason", r.stop_reason},
                           {"ttft_s", r.ttft_s},
                           {"decode_s", r.decode_s},
                           {"decode_tokens", r.n_decoded},
                           {"decode_tokens_per_s", r.decode_tokens_per_second()}});
    };

    reset_peak_rss();
    if (!a.query_aware) {
        Prepared p = prepare(ctx);
        report_compression(p);
        prepared_json.push_back(prepared_to_json(p));
        for (size_t qi = 0; qi < prompts.size(); ++qi) {
            KvStore work = p.cache.copy();
            answer(qi, work, prompts[qi].query);
        }
    } else {
        // the question joins the context before compression; its last token is fed as the query
        for (size_t qi = 0; qi < prompts.size(); ++qi) {
            std::vector<int32_t> all = prompts[qi].context;
            all.insert(all.end(), prompts[qi].query.begin(), prompts[qi].query.end() - 1);
            Prepared p = prepare(all);
            report_compression(p);
            prepared_json.push_back(prepared_to_json(p));
            answer(qi, p.cache, {prompts[qi].query.back()});
        }
    }
    if (a.json) {
        nlohmann::json j;
        j["context_file"] = a.context_file;
        j["method"] = a.method;
        j["budget"] =
            compressing
                ? nlohmann::json{{"ratio", budget.tokens >= 0 ? nlohmann::json() : nlohmann::json(budget.ratio)},
                                 {"tokens", budget.tokens >= 0 ? nlohmann::json(budget.tokens) : nlohmann::json()}}
                : nlohmann::json();
        j["method_params"] = press ? press->params() : nlohmann::json::object();
        j["query_aware"] = a.query_aware;
        j["prepared"] = prepared_json;
        j["answers"] = answers;
        j["memory"] = memory_json(*l.model, nullptr, &engine);
        j["params"] = {{"max_tokens", a.max_tokens}, {"chunk_size", a.chunk}, {"attention", a.attention},
                       {"threads", a.threads},       {"reserve", reserve},    {"stop_on_eog", !a.no_stop}};
        j["provenance"] = provenance(*l.model, *l.tok);
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        const MemInfo mi = mem_info();
        std::fprintf(stderr, "\n[memory]   weights %s | compute %s | RSS %s, peak %s\n",
                     human_bytes(l.model->weight_bytes()).c_str(), human_bytes(engine.compute_bytes()).c_str(),
                     human_bytes(mi.rss_bytes).c_str(), human_bytes(mi.peak_rss_bytes).c_str());
    }
    return 0;
}

}  // namespace

void add_ask_command(CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand(
        "ask", "Prefill a context once, compress its KV cache once, answer each question from an independent copy");
    auto a = std::make_shared<AskArgs>();
    cmd->add_option("MODEL", a->model, "short name or .gguf path")->required();
    cmd->add_option("--context-file", a->context_file, "the long context (a text file)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--question,-q", a->questions, "a question about the context (repeatable)")->required();
    cmd->add_option("--method", a->method, "compression method (`kvlab methods`), or none for the full cache")
        ->capture_default_str();
    auto * b = cmd->add_option_group("budget", "with --method, exactly one of");
    b->add_option("--ratio", a->ratio, "compression ratio: fraction of the context's KV pairs removed, in [0, 1)");
    b->add_option("--budget", a->budget, "tokens kept per layer, observation window included");
    b->require_option(0, 1);
    cmd->add_option("--param", a->params, "method parameter KEY=VALUE (repeatable; see `kvlab methods`)");
    cmd->add_flag("--query-aware", a->query_aware,
                  "append each question to the context before compressing (one prefill and compression per question)");
    cmd->add_option("--max-tokens", a->max_tokens, "most tokens per answer")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--threads", a->threads, "CPU threads")->capture_default_str()->check(CLI::PositiveNumber);
    cmd->add_option("--chunk", a->chunk, "prefill chunk size in tokens")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    add_attention_option(cmd, a->attention);
    cmd->add_flag("--no-stop", a->no_stop, "do not stop at end-of-generation tokens");
    cmd->add_flag("--json", a->json, "print one JSON object: answers, timings, bytes, kept rows, provenance");
    cmd->callback([&rc, a] { rc = run_ask(*a); });
}

}  // namespace kvlab::cli
