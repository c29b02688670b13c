#include "eval_cli.h"

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/fetch.h"
#include "common.h"
#include "environment.h"
#include "eval/report.h"
#include "kvlab/error.h"

namespace kvlab::cli {

namespace fs = std::filesystem;

namespace {

std::string duration(double s) {
    char b[32];
    const int t = int(s + 0.5);
    if (t >= 60)
        std::snprintf(b, sizeof(b), "%dm%02ds", t / 60, t % 60);
    else
        std::snprintf(b, sizeof(b), "%ds", t);
    return b;
}

void progress_bar(const eval::Progress & p) {
    const double frac = p.total > 0 ? double(p.done) / double(p.total) : 0.0;
    const int width = 24, fill = int(frac * width);
    std::string bar(size_t(fill), '#');
    bar.resize(width, '.');
    const int64_t fresh = p.done - p.skipped;
    const double eta = fresh > 0 ? p.elapsed_s / double(fresh) * double(p.total - p.done) : 0.0;
    std::string what = p.what.substr(0, 48);
    std::fprintf(stderr, "\r[%s] %lld/%lld %3.0f%% %s elapsed, ETA %s  %-48s", bar.c_str(),
                 static_cast<long long>(p.done), static_cast<long long>(p.total), 100.0 * frac,
                 duration(p.elapsed_s).c_str(), fresh > 0 ? duration(eta).c_str() : "?", what.c_str());
    if (p.what == "done") std::fprintf(stderr, "\n");
}

// "i/N" with 0 <= i < N.
std::pair<int, int> parse_shard(const std::string & s) {
    const size_t slash = s.find('/');
    int i = -1, n = -1;
    auto whole = [](const std::string & t, int & out) {
        const auto r = std::from_chars(t.data(), t.data() + t.size(), out);
        return !t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size();
    };
    if (slash == std::string::npos || !whole(s.substr(0, slash), i) || !whole(s.substr(slash + 1), n) || n < 1 ||
        i < 0 || i >= n)
        throw Error("eval", "--shard takes i/N with 0 <= i < N (e.g. 0/8), got '" + s + "'");
    return {i, n};
}

}  // namespace

void add_eval_options(CLI::App * cmd, EvalArgs * a) {
    eval::RunConfig & f = a->flags;
    auto over = [a](CLI::Option * o, std::function<void(eval::RunConfig &)> apply) {
        a->overrides.emplace_back(o, std::move(apply));
    };
    over(add_list_option(cmd, "--tasks", f.tasks, "tasks (niah, passkey, ruler_niah_single, ..., qa:FILE.jsonl)"),
         [a](eval::RunConfig & c) { c.tasks = a->flags.tasks; });
    over(add_list_option(cmd, "--lengths", f.task.lengths, "context lengths in tokens"),
         [a](eval::RunConfig & c) { c.task.lengths = a->flags.task.lengths; });
    over(add_list_option(cmd, "--depths", f.task.depths, "needle depths in [0, 1]"),
         [a](eval::RunConfig & c) { c.task.depths = a->flags.task.depths; });
    over(cmd->add_option("--samples", f.task.n_samples, "samples per (length, depth)")->check(CLI::PositiveNumber),
         [a](eval::RunConfig & c) { c.task.n_samples = a->flags.task.n_samples; });
    over(cmd->add_option("--seed", f.task.seed, "task seed"),
         [a](eval::RunConfig & c) { c.task.seed = a->flags.task.seed; });
    std::string methods_default;
    for (const auto & m : f.methods) methods_default += (methods_default.empty() ? "" : ",") + m.name;
    over(add_list_option(cmd, "--methods", a->methods, "methods (the full cache always runs)")
             ->default_str(methods_default),
         [a](eval::RunConfig & c) {
             c.methods.clear();
             for (const std::string & m : a->methods) c.methods.push_back({m, {}});
         });
    std::string ratios_default, budgets_default, bytes_default;
    for (const auto & bc : f.budgets) {
        const Budget & b = bc.b;
        std::string & d = b.bytes_ratio > 0.0 ? bytes_default : b.tokens >= 0 ? budgets_default : ratios_default;
        std::ostringstream v;
        if (b.bytes_ratio > 0.0)
            v << b.bytes_ratio;
        else if (b.tokens >= 0)
            v << b.tokens;
        else
            v << b.ratio;
        d += (d.empty() ? "" : ",") + v.str();
    }
    CLI::Option * ratios =
        add_list_option(cmd, "--ratios", a->ratios, "compression ratios")->default_str(ratios_default);
    CLI::Option * budgets =
        add_list_option(cmd, "--budgets", a->budgets, "token budgets per layer")->default_str(budgets_default);
    CLI::Option * bytes = add_list_option(cmd, "--bytes-ratios", a->bytes_ratios,
                                          "byte budgets: shares in (0, 1] of the context's full cache at F16")
                              ->default_str(bytes_default);
    CLI::Option * demote =
        add_list_option(cmd, "--demote", a->demote,
                        "each budget once per entry: none (evict) or the type the rows it would evict are kept at "
                        "(q8_0, q4_0; mixed precision)")
            ->default_str("none");
    // every budget given (or the experiment's), once per --demote entry
    auto set_budgets = [a, ratios, budgets, bytes, demote](eval::RunConfig & c) {
        std::vector<Budget> base;
        if (ratios->count() || budgets->count() || bytes->count()) {
            if (ratios->count())
                for (double r : a->ratios) base.push_back(Budget::from_ratio(r));
            if (budgets->count())
                for (int64_t b : a->budgets) base.push_back(Budget::from_tokens(b));
            if (bytes->count())
                for (double r : a->bytes_ratios) base.push_back(Budget::from_bytes_ratio(r));
        } else {
            for (const auto & b : c.budgets) base.push_back(b.b);
        }
        const std::vector<std::string> demotes = demote->count() ? a->demote : std::vector<std::string>{""};
        c.budgets.clear();
        for (const std::string & d : demotes)
            for (Budget b : base) {
                if (!d.empty() && d != "none") b.set_demotion(parse_cache_type(d), -1.0);
                c.budgets.push_back({b});
            }
    };
    for (CLI::Option * o : {ratios, budgets, bytes, demote})
        over(o, [ratios, budgets, bytes, o, set_budgets](eval::RunConfig & c) {
            for (CLI::Option * first : {ratios, budgets, bytes})  // together they are applied once
                if (first->count()) {
                    if (first == o) set_budgets(c);
                    return;
                }
            set_budgets(c);  // --demote alone: over the experiment's budgets
        });
    add_param_option(cmd, a->params, true);
    over(add_preset_option(cmd, f.preset), [a](eval::RunConfig & c) { c.preset = a->flags.preset; });
    over(cmd->add_flag("--query-aware", a->query_aware, "append each question to the context before compressing"),
         [](eval::RunConfig & c) { c.query_aware = true; });
    over(cmd->add_flag("--multi-turn", a->multi_turn,
                       "compress with each sample's first question in the context, then answer every question "
                       "from that one cache (KVzip's multi-query setting; the report splits q1 from later ones)"),
         [](eval::RunConfig & c) { c.multi_turn = true; });
    over(cmd->add_option("-n,--max-tokens", f.max_tokens, "most tokens per answer")->check(CLI::PositiveNumber),
         [a](eval::RunConfig & c) { c.max_tokens = a->flags.max_tokens; });
    over(cmd->add_option("--long-tokens", f.task.long_tokens,
                         "answer length of the long-generation tasks (long_continuation)")
             ->check(CLI::PositiveNumber)
             ->capture_default_str(),
         [a](eval::RunConfig & c) { c.task.long_tokens = a->flags.task.long_tokens; });
    add_decode_policy_options(cmd, a->decode);
    over(cmd->get_option("--decode-policy"), [a](eval::RunConfig & c) { c.decode.method = a->decode.o.method; });
    over(cmd->get_option("--decode-interval"), [a](eval::RunConfig & c) { c.decode.interval = a->decode.o.interval; });
    over(cmd->get_option("--decode-target"), [a](eval::RunConfig & c) { c.decode.target = a->decode.o.target; });
    over(cmd->get_option("--decode-param"), [a](eval::RunConfig & c) {
        for (const auto & [k, v] : parse_params(a->decode.params)) c.decode.params[k] = v;
    });
    over(add_threads_option(cmd, f.threads), [a](eval::RunConfig & c) { c.threads = a->flags.threads; });
    add_kernel_options(cmd, a->kernels);
    over(cmd->get_option("--products"), [a](eval::RunConfig & c) { c.products = a->kernels.products; });
    over(cmd->get_option("--no-repack"), [a](eval::RunConfig & c) { c.repack = !a->kernels.no_repack; });
    add_engine_options(cmd, a->engine);
    over(cmd->get_option("--chunk"), [a](eval::RunConfig & c) { c.chunk = a->engine.chunk; });
    over(cmd->get_option("--attention"), [a](eval::RunConfig & c) { c.attention = a->engine.attention; });
    over(cmd->get_option("--cache-type-k"), [a](eval::RunConfig & c) { c.cache_type_k = a->engine.cache_type_k; });
    over(cmd->get_option("--cache-type-v"), [a](eval::RunConfig & c) { c.cache_type_v = a->engine.cache_type_v; });
    over(cmd->get_option("--no-kv-rotation"), [](eval::RunConfig & c) { c.kv_rotation = false; });
    over(add_list_option(cmd, "--cache-types", a->cache_types,
                         "the cache-type axis: each context prefilled once per entry (f16, q8_0, q4_0, or K/V as "
                         "q8_0/q4_0), its full cache and every method x budget; fidelity against the first entry's "
                         "full cache"),
         [a](eval::RunConfig & c) {
             for (const std::string & t : a->cache_types) eval::parse_types(t);
             c.cache_types = a->cache_types;
         });
    over(cmd->add_option("-o,--out", f.out_dir, "output directory (records, report)"),
         [a](eval::RunConfig & c) { c.out_dir = a->flags.out_dir; });
    over(cmd->add_option("--shard", a->shard, "run shard i of N (i/N): sample k goes to shard k mod N"),
         [a](eval::RunConfig & c) { std::tie(c.shard, c.n_shards) = parse_shard(a->shard); });
}

eval::RunConfig resolve_eval(const EvalArgs & a, eval::RunConfig c) {
    if (!a.model.empty()) c.model = a.model;
    for (const auto & [opt, apply] : a.overrides)
        if (opt->count()) apply(c);
    std::vector<std::string> names;
    for (const auto & m : c.methods) names.push_back(m.name);
    for (const auto & [method, params] : parse_method_params(a.params, names))
        for (auto & m : c.methods)
            if (m.name == method)
                for (const auto & [k, v] : params) m.params[k] = v;
    return c;
}

int run_eval(const eval::RunConfig & c, bool report) {
    std::fprintf(stderr, "[eval] configuration:\n%s\n", c.to_json().dump(2).c_str());
    const Environment & e = environment();
    const auto resolve = [&e](const std::string & m) { return resolve_model(m, e.models); };
    const std::string out = eval::run(c, eval::RunEnv{resolve, e.cache_dir, e.data_dir}, progress_bar);
    std::fprintf(stderr, "[eval] records: %s\n", out.c_str());
    if (report) {
        if (c.n_shards == 1)
            write_report({out}, c.out_dir, true);
        else
            std::fprintf(stderr, "[eval] shard %d/%d done; merge the shards with `kvlab report %s`\n", c.shard,
                         c.n_shards, c.out_dir.c_str());
    }
    return 0;
}

namespace {
// The answer records of `files` and the first header among them; throws when there is no answer.
std::vector<nlohmann::json> answers_of(const std::vector<std::string> & files, nlohmann::json * header) {
    std::vector<nlohmann::json> answers;
    for (const auto & r : eval::read_records(files)) {
        if (r.value("kind", "") == "answer")
            answers.push_back(r);
        else if (r.value("kind", "") == "header" && header && header->is_null())
            *header = r;
    }
    if (answers.empty()) throw Error("report", "no answer records in the given files");
    return answers;
}

std::string markdown_of(const std::vector<eval::SummaryRow> & rows) {
    return eval::markdown_table(rows) + "\n" + eval::best_per_ratio(rows) + eval::best_per_bytes(rows);
}
}  // namespace

std::string summary_markdown(const std::vector<std::string> & files) {
    return markdown_of(eval::summarize(answers_of(files, nullptr)));
}

void write_report(const std::vector<std::string> & files, const std::string & dir, bool print) {
    nlohmann::json header;
    const std::vector<nlohmann::json> answers = answers_of(files, &header);
    const auto rows = eval::summarize(answers);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("report", "cannot create " + dir + ": " + ec.message());
    auto put = [&](const std::string & name, const std::string & text) {
        const fs::path p = fs::path(dir) / name;
        std::ofstream os(p);
        os << text;
        if (!os.flush()) throw Error("report", "cannot write " + p.string());
    };
    const std::string md = markdown_of(rows);
    put("summary.md", md);
    put("score_vs_ratio.svg", eval::svg_score_vs_ratio(rows));
    put("kl_vs_ratio.svg", eval::svg_kl_vs_ratio(rows));
    put("memory_vs_ttft.svg", eval::svg_memory_vs_ttft(rows));
    put("score_vs_bytes.svg", eval::svg_score_vs_bytes(rows));
    put("kl_vs_bytes.svg", eval::svg_kl_vs_bytes(rows));
    put("report.html", eval::html_report(rows, header));
    if (print) std::printf("%s\n", md.c_str());
    std::fprintf(stderr, "[report] %zu answers from %zu file(s): %s/{summary.md, report.html, *.svg}\n", answers.size(),
                 files.size(), dir.c_str());
}

}  // namespace kvlab::cli
