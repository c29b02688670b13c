// kvlab eval / report / demo: the evaluation harness on the command line. `eval` runs an
// experiment (a JSON file and/or flags) into JSONL records, resumable and shardable;
// `report` merges shards into a markdown table, SVG plots and an HTML page; `demo` is the
// main job: a fixed comparison on the default model and the bundled essays.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common.h"
#include "eval/report.h"
#include "eval/runner.h"
#include "kvlab/error.h"

namespace kvlab::cli {

namespace {

namespace fs = std::filesystem;

template <typename T>
std::vector<T> parse_list(const std::string & s, const char * what) {
    std::vector<T> out;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ',');) {
        if (x.empty()) continue;
        std::istringstream is(x);
        T v;
        if (!(is >> v) || !is.eof()) throw Error("eval", std::string("bad value '") + x + "' in " + what);
        out.push_back(v);
    }
    return out;
}

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

// Writes summary.md, the SVG plots and report.html into dir; prints the table.
void write_report(const std::vector<std::string> & files, const std::string & dir, bool print) {
    const auto records = eval::read_records(files);
    std::vector<nlohmann::json> answers;
    nlohmann::json header;
    for (const auto & r : records) {
        if (r.value("kind", "") == "answer")
            answers.push_back(r);
        else if (r.value("kind", "") == "header" && header.is_null())
            header = r;
    }
    if (answers.empty()) throw Error("report", "no answer records in the given files");
    const auto rows = eval::summarize(answers);
    fs::create_directories(dir);
    auto put = [&](const std::string & name, const std::string & text) { std::ofstream(fs::path(dir) / name) << text; };
    const std::string md = eval::markdown_table(rows);
    put("summary.md", md);
    put("score_vs_ratio.svg", eval::svg_score_vs_ratio(rows));
    put("kl_vs_ratio.svg", eval::svg_kl_vs_ratio(rows));
    put("memory_vs_ttft.svg", eval::svg_memory_vs_ttft(rows));
    put("report.html", eval::html_report(rows, header));
    if (print) std::printf("%s\n", md.c_str());
    std::fprintf(stderr, "[report] %zu answers from %zu file(s): %s/{summary.md, report.html, *.svg}\n", answers.size(),
                 files.size(), dir.c_str());
}

struct EvalArgs {
    std::string experiment, model, tasks, lengths, depths, methods, ratios, budgets, out, shard, attention;
    std::vector<std::string> params;
    int samples = -1, max_tokens = -1, threads = -1, chunk = -1;
    int64_t seed = -1;
    bool query_aware = false, no_report = false;
};

eval::RunConfig resolve(const EvalArgs & a) {
    eval::RunConfig c;
    if (!a.experiment.empty()) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_file(a.experiment));
        } catch (const nlohmann::json::exception & e) {
            throw Error("eval", a.experiment + ": not valid JSON: " + e.what());
        }
        if (j.is_object() && !j.contains("threads")) j["threads"] = default_threads();
        c = eval::RunConfig::from_json(j);
    } else {
        c.threads = default_threads();
    }
    if (!a.model.empty()) c.model = a.model;
    if (!a.tasks.empty()) c.tasks = parse_list<std::string>(a.tasks, "--tasks");
    if (!a.lengths.empty()) c.task.lengths = parse_list<int64_t>(a.lengths, "--lengths");
    if (!a.depths.empty()) c.task.depths = parse_list<double>(a.depths, "--depths");
    if (a.samples > 0) c.task.n_samples = a.samples;
    if (a.seed >= 0) c.task.seed = uint64_t(a.seed);
    if (!a.methods.empty()) {
        c.methods.clear();
        for (const auto & m : parse_list<std::string>(a.methods, "--methods")) c.methods.push_back({m, {}});
    }
    for (const std::string & p : a.params) {  // METHOD:KEY=VALUE
        const size_t colon = p.find(':'), eq = p.find('=');
        if (colon == std::string::npos || eq == std::string::npos || eq < colon)
            throw Error("eval", "--param takes METHOD:KEY=VALUE, got '" + p + "'");
        bool found = false;
        for (auto & m : c.methods)
            if (m.name == p.substr(0, colon)) {
                m.params[p.substr(colon + 1, eq - colon - 1)] = p.substr(eq + 1);
                found = true;
            }
        if (!found) throw Error("eval", "--param " + p + ": no method " + p.substr(0, colon) + " in the run");
    }
    if (!a.ratios.empty() || !a.budgets.empty()) c.budgets.clear();
    for (double r : parse_list<double>(a.ratios, "--ratios")) c.budgets.push_back({r, -1});
    for (int64_t b : parse_list<int64_t>(a.budgets, "--budgets")) c.budgets.push_back({-1.0, b});
    if (a.query_aware) c.query_aware = true;
    if (a.max_tokens > 0) c.max_tokens = a.max_tokens;
    if (a.threads > 0) c.threads = a.threads;
    if (a.chunk > 0) c.chunk = a.chunk;
    if (!a.attention.empty()) c.attention = a.attention;
    if (!a.out.empty()) c.out_dir = a.out;
    if (!a.shard.empty()) {
        const size_t slash = a.shard.find('/');
        if (slash == std::string::npos) throw Error("eval", "--shard takes i/N, got '" + a.shard + "'");
        c.shard = std::stoi(a.shard.substr(0, slash));
        c.n_shards = std::stoi(a.shard.substr(slash + 1));
    }
    return c;
}

int run_eval(const eval::RunConfig & c, bool report) {
    std::fprintf(stderr, "[eval] configuration:\n%s\n", c.to_json().dump(2).c_str());
    const std::string out = eval::run(c, progress_bar);
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

void add_eval_options(CLI::App * cmd, EvalArgs * a) {
    cmd->add_option("--model", a->model, "short name or .gguf path (default smollm2-135m)");
    cmd->add_option("--tasks", a->tasks,
                    "comma-separated tasks (niah, passkey, ruler_niah_single, ..., qa:FILE.jsonl)");
    cmd->add_option("--lengths", a->lengths, "context lengths in tokens, comma-separated");
    cmd->add_option("--depths", a->depths, "needle depths in [0, 1], comma-separated");
    cmd->add_option("--samples", a->samples, "samples per (length, depth)");
    cmd->add_option("--seed", a->seed, "task seed");
    cmd->add_option("--methods", a->methods, "comma-separated methods (the full cache always runs)");
    cmd->add_option("--ratios", a->ratios, "compression ratios, comma-separated");
    cmd->add_option("--budgets", a->budgets, "token budgets per layer, comma-separated");
    cmd->add_option("--param", a->params, "METHOD:KEY=VALUE (repeatable)");
    cmd->add_flag("--query-aware", a->query_aware, "append each question to the context before compressing");
    cmd->add_option("--max-tokens", a->max_tokens, "most tokens per answer");
    cmd->add_option("--threads", a->threads, "CPU threads");
    cmd->add_option("--chunk", a->chunk, "prefill chunk size");
    add_attention_option(cmd, a->attention);
    cmd->add_option("--out", a->out, "output directory (records, report)");
    cmd->add_option("--shard", a->shard, "run shard i of N (i/N): sample k goes to shard k mod N");
}

}  // namespace

void add_eval_commands(CLI::App & app, int & rc) {
    {
        auto * cmd = app.add_subcommand(
            "eval", "Run an evaluation: tasks x methods x budgets, one JSONL record per answer (resumable, shardable)");
        auto a = std::make_shared<EvalArgs>();
        cmd->add_option("EXPERIMENT", a->experiment, "a JSON experiment file (flags override its keys)")
            ->check(CLI::ExistingFile);
        add_eval_options(cmd, a.get());
        cmd->add_flag("--no-report", a->no_report, "do not write the report at the end");
        cmd->callback([&rc, a] { rc = run_eval(resolve(*a), !a->no_report); });
    }
    {
        auto * cmd = app.add_subcommand("report", "Merge result shards into summary.md, SVG plots and report.html");
        auto inputs = std::make_shared<std::vector<std::string>>();
        auto out = std::make_shared<std::string>();
        cmd->add_option("INPUTS", *inputs, "result directories or records-*.jsonl files")->required();
        cmd->add_option("--out", *out, "where to write the report (default: the first input directory)");
        cmd->callback([&rc, inputs, out] {
            std::vector<std::string> files;
            for (const std::string & in : *inputs) {
                if (fs::is_directory(in)) {
                    std::vector<std::string> f;
                    for (const auto & e : fs::directory_iterator(in))
                        if (e.path().filename().string().rfind("records-", 0) == 0 && e.path().extension() == ".jsonl")
                            f.push_back(e.path().string());
                    std::sort(f.begin(), f.end());
                    if (f.empty()) throw Error("report", in + ": no records-*.jsonl files");
                    files.insert(files.end(), f.begin(), f.end());
                } else if (fs::exists(in)) {
                    files.push_back(in);
                } else {
                    throw Error("report", "no such file or directory: " + in);
                }
            }
            const std::string dir = !out->empty() ? *out
                                    : fs::is_directory(inputs->front())
                                        ? inputs->front()
                                        : fs::path(inputs->front()).parent_path().string();
            write_report(files, dir.empty() ? "." : dir, true);
            rc = 0;
        });
    }
    {
        auto * cmd = app.add_subcommand(
            "demo",
            "The main job: 8 methods x 3 ratios vs the full cache on needle-in-a-haystack and RULER niah, "
            "default model, bundled essays; prints the table and writes the report");
        auto a = std::make_shared<EvalArgs>();
        add_eval_options(cmd, a.get());
        cmd->callback([&rc, a] {
            EvalArgs d = *a;
            if (d.tasks.empty()) d.tasks = "niah,ruler_niah_single";
            if (d.lengths.empty()) d.lengths = "1536";
            if (d.depths.empty()) d.depths = "0.1,0.5,0.9";
            if (d.methods.empty()) d.methods = "streaming_llm,snapkv,pyramidkv,h2o,tova,knorm,adakv,expected_attention";
            if (d.ratios.empty() && d.budgets.empty()) d.ratios = "0.5,0.75,0.9";
            if (d.max_tokens <= 0) d.max_tokens = 24;
            if (d.out.empty()) d.out = "kvlab-demo";
            rc = run_eval(resolve(d), true);
        });
    }
}

}  // namespace kvlab::cli
