#include "eval/runner.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "eval/metrics.h"
#include "eval/report.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/registry.h"
#include "kvlab/sys.h"
#include "kvlab/text.h"

namespace kvlab::eval {

namespace fs = std::filesystem;

std::string BudgetConfig::label() const {
    std::ostringstream o;
    if (tokens >= 0)
        o << "budget " << tokens;
    else
        o << "ratio " << ratio;
    return o.str();
}

Budget BudgetConfig::budget() const {
    return tokens >= 0 ? Budget::from_tokens(tokens) : Budget::from_ratio(ratio);
}

nlohmann::json RunConfig::to_json() const {
    nlohmann::json methods_j = nlohmann::json::array(), budgets_j = nlohmann::json::array();
    for (const auto & m : methods) methods_j.push_back({{"name", m.name}, {"params", m.params}});
    for (const auto & b : budgets)
        budgets_j.push_back(b.tokens >= 0 ? nlohmann::json{{"tokens", b.tokens}} : nlohmann::json{{"ratio", b.ratio}});
    return {{"model", model},
            {"tasks", tasks},
            {"lengths", task.lengths},
            {"depths", task.depths},
            {"samples", task.n_samples},
            {"seed", task.seed},
            {"haystack", haystack},
            {"methods", methods_j},
            {"budgets", budgets_j},
            {"query_aware", query_aware},
            {"max_tokens", max_tokens},
            {"threads", threads},
            {"chunk", chunk},
            {"attention", attention},
            {"out_dir", out_dir},
            {"shard", shard},
            {"n_shards", n_shards}};
}

RunConfig RunConfig::from_json(const nlohmann::json & j) {
    if (!j.is_object()) throw Error("eval", "an experiment is a JSON object");
    static const std::set<std::string> known = {
        "model",       "tasks",      "lengths", "depths", "samples",   "seed",    "haystack", "methods", "budgets",
        "query_aware", "max_tokens", "threads", "chunk",  "attention", "out_dir", "shard",    "n_shards"};
    for (const auto & [k, v] : j.items())
        if (!known.count(k)) throw Error("eval", "unknown experiment key '" + k + "'");
    RunConfig c;
    try {
        if (j.contains("model")) c.model = j["model"].get<std::string>();
        if (j.contains("tasks")) c.tasks = j["tasks"].get<std::vector<std::string>>();
        if (j.contains("lengths")) c.task.lengths = j["lengths"].get<std::vector<int64_t>>();
        if (j.contains("depths")) c.task.depths = j["depths"].get<std::vector<double>>();
        if (j.contains("samples")) c.task.n_samples = j["samples"].get<int>();
        if (j.contains("seed")) c.task.seed = j["seed"].get<uint64_t>();
        if (j.contains("haystack")) c.haystack = j["haystack"].get<std::vector<std::string>>();
        if (j.contains("methods"))
            for (const auto & m : j["methods"]) {
                MethodConfig mc;
                if (m.is_string()) {
                    mc.name = m.get<std::string>();
                } else {
                    mc.name = m.at("name").get<std::string>();
                    if (m.contains("params"))
                        for (const auto & [k, v] : m["params"].items())
                            mc.params[k] = v.is_string() ? v.get<std::string>() : v.dump();
                }
                c.methods.push_back(mc);
            }
        if (j.contains("budgets"))
            for (const auto & b : j["budgets"]) {
                BudgetConfig bc;
                if (b.is_number())
                    bc.ratio = b.get<double>();
                else if (b.contains("tokens"))
                    bc.tokens = b["tokens"].get<int64_t>();
                else
                    bc.ratio = b.at("ratio").get<double>();
                c.budgets.push_back(bc);
            }
        if (j.contains("query_aware")) c.query_aware = j["query_aware"].get<bool>();
        if (j.contains("max_tokens")) c.max_tokens = j["max_tokens"].get<int>();
        if (j.contains("threads")) c.threads = j["threads"].get<int>();
        if (j.contains("chunk")) c.chunk = j["chunk"].get<int>();
        if (j.contains("attention")) c.attention = j["attention"].get<std::string>();
        if (j.contains("out_dir")) c.out_dir = j["out_dir"].get<std::string>();
        if (j.contains("shard")) c.shard = j["shard"].get<int>();
        if (j.contains("n_shards")) c.n_shards = j["n_shards"].get<int>();
    } catch (const nlohmann::json::exception & e) {
        throw Error("eval", std::string("malformed experiment: ") + e.what());
    }
    return c;
}

std::vector<std::string> default_haystack() {
    std::vector<fs::path> roots;
    if (const char * d = std::getenv("KVLAB_DATA_DIR")) roots.emplace_back(d);
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        roots.push_back(exe.parent_path().parent_path() / "data");
        roots.push_back(exe.parent_path().parent_path().parent_path() / "data");
    }
    roots.push_back(fs::current_path() / "data");
    for (const fs::path & r : roots) {
        const fs::path dir = r / "haystack";
        if (!fs::is_directory(dir, ec)) continue;
        std::vector<std::string> files;
        for (const auto & e : fs::directory_iterator(dir))
            if (e.path().extension() == ".txt") files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
        if (!files.empty()) return files;
    }
    throw Error("eval", "cannot find the haystack essays (data/haystack); set KVLAB_DATA_DIR or give haystack files");
}

namespace {

struct Key {
    std::string sample;
    int64_t question;
    std::string method, budget;
    bool operator<(const Key & o) const {
        return std::tie(sample, question, method, budget) < std::tie(o.sample, o.question, o.method, o.budget);
    }
};

std::vector<float> teacher_forced(Engine & e, const KvStore & cache, const std::vector<int32_t> & query,
                                  const std::vector<int32_t> & answer, int64_t n_vocab) {
    KvStore work = cache.copy();
    std::vector<int32_t> seq = query;
    if (!answer.empty()) seq.insert(seq.end(), answer.begin(), answer.end() - 1);
    std::vector<float> all;
    e.prefill(work, seq, nullptr, &all);
    const int64_t rows = std::max<int64_t>(1, int64_t(answer.size()));
    const int64_t first = int64_t(query.size()) - 1;
    return {all.begin() + first * n_vocab, all.begin() + (first + rows) * n_vocab};
}

double achieved_ratio(const KvStore & c, int64_t context_rows) {
    const double full = double(context_rows) * c.n_layer() * c.n_head_kv();
    return full > 0 ? 1.0 - double(c.total_rows()) / full : 0.0;
}

}  // namespace

std::string run(const RunConfig & cfg, const std::function<void(const Progress &)> & on_progress) {
    if (cfg.n_shards < 1 || cfg.shard < 0 || cfg.shard >= cfg.n_shards)
        throw Error("eval", "shard must be i/N with 0 <= i < N");
    if (cfg.max_tokens < 1) throw Error("eval", "max_tokens must be at least 1");
    const std::string path = resolve_model(cfg.model);
    auto model = Model::load(path, cfg.threads);
    Tokenizer tok(path);
    for (const auto & m : cfg.methods) make_press(m.name, m.params, *model);  // validate before any work
    for (const auto & b : cfg.budgets) (void)b.budget();
    if (!cfg.methods.empty() && cfg.budgets.empty()) throw Error("eval", "methods need at least one budget");

    // samples, deterministic; this shard's share
    const Haystack hay = load_haystack(cfg.haystack.empty() ? default_haystack() : cfg.haystack);
    const TokenCounter count = [&](const std::string & s) { return int64_t(tok.encode(s, false).size()); };
    std::vector<Sample> samples;
    for (const std::string & t : cfg.tasks) {
        std::vector<Sample> s =
            t.rfind("qa:", 0) == 0 ? load_qa_jsonl(t.substr(3)) : make_task(t, cfg.task, hay, count);
        samples.insert(samples.end(), s.begin(), s.end());
    }
    std::vector<Sample> mine;
    for (size_t i = 0; i < samples.size(); ++i)
        if (int(i % cfg.n_shards) == cfg.shard) mine.push_back(samples[i]);

    fs::create_directories(cfg.out_dir);
    const std::string out = (fs::path(cfg.out_dir) / ("records-" + std::to_string(cfg.shard) + "-of-" +
                                                      std::to_string(cfg.n_shards) + ".jsonl"))
                                .string();
    std::set<Key> done;
    if (fs::exists(out))
        for (const auto & r : read_records({out}))
            if (r.value("kind", "") == "answer")
                done.insert({r["sample_id"], r["question_index"], r["method"], r["budget_label"]});
    std::ofstream os(out, std::ios::app);
    if (!os) throw Error("eval", "cannot write " + out);
    if (fs::file_size(out) == 0) {
        nlohmann::json header = {{"kind", "header"},
                                 {"config", cfg.to_json()},
                                 {"shard", std::to_string(cfg.shard) + "/" + std::to_string(cfg.n_shards)},
                                 {"n_samples", samples.size()},
                                 {"provenance", provenance(*model, tok)}};
        os << header.dump() << "\n" << std::flush;
    }

    Engine engine(*model, EngineOptions{cfg.chunk, parse_attention_kernel(cfg.attention)});
    const int64_t n_vocab = model->hparams().n_vocab;
    GenerateOptions go;
    go.max_tokens = cfg.max_tokens;
    go.eog_ids = tok.eog_ids();
    struct Config {
        std::string method, label;
        ParamMap params;
        BudgetConfig budget;
    };
    std::vector<Config> configs = {{"none", "full", {}, {}}};
    for (const auto & m : cfg.methods)
        for (const auto & b : cfg.budgets) configs.push_back({m.name, b.label(), m.params, b});

    Progress pr;
    for (const Sample & s : mine) pr.total += int64_t(s.questions.size() * configs.size());
    const double t_start = now_seconds();
    auto tick = [&](const std::string & what) {
        pr.elapsed_s = now_seconds() - t_start;
        pr.what = what;
        if (on_progress) on_progress(pr);
    };
    tick("starting");

    for (const Sample & s : mine) {
        std::vector<Tokenizer::SplitPrompt> prompts;
        for (const Question & q : s.questions) prompts.push_back(tok.context_prompt(s.context, q.question));
        int64_t max_query = 0;
        for (const auto & p : prompts) max_query = std::max<int64_t>(max_query, int64_t(p.query.size()));
        const int64_t reserve = 2 * (max_query + cfg.max_tokens);
        // the questions still to answer per config
        std::vector<std::vector<size_t>> todo(configs.size());
        int64_t n_todo = 0;
        for (size_t c = 0; c < configs.size(); ++c)
            for (size_t qi = 0; qi < s.questions.size(); ++qi)
                if (!done.count({s.id, int64_t(qi), configs[c].method, configs[c].label})) {
                    todo[c].push_back(qi);
                    ++n_todo;
                } else {
                    ++pr.done;
                    ++pr.skipped;
                }
        if (n_todo == 0) continue;

        // One prefill per context (per question when query-aware) serves every method:
        // their observers run side by side; each method's scoring time is its own.
        const size_t n_groups = cfg.query_aware ? s.questions.size() : 1;
        std::vector<std::vector<int32_t>> full_answers(s.questions.size());
        std::vector<std::vector<float>> full_logits(s.questions.size());
        for (size_t grp = 0; grp < n_groups; ++grp) {
            std::vector<int32_t> ctx = prompts[cfg.query_aware ? grp : 0].context;
            if (cfg.query_aware) ctx.insert(ctx.end(), prompts[grp].query.begin(), prompts[grp].query.end() - 1);
            const int64_t L = int64_t(ctx.size());
            if (L + reserve > model->hparams().n_ctx_train)
                throw Error("eval", s.id + ": " + std::to_string(L) + " context tokens leave no room in the model's " +
                                        std::to_string(model->hparams().n_ctx_train));
            std::vector<std::unique_ptr<Press>> presses(configs.size());
            KvStore base = engine.new_cache(L);
            ObserverSet obs(*model);
            for (size_t c = 1; c < configs.size(); ++c) {
                presses[c] = make_press(configs[c].method, configs[c].params, *model);
                obs.add(presses[c]->observer(base, L));
            }
            tick(s.id + ": prefill " + std::to_string(L) + " tokens");
            PrefillStats ps;
            engine.prefill(base, ctx, &ps, nullptr, obs.get());
            double observing = 0.0;
            for (size_t c = 1; c < configs.size(); ++c) observing += presses[c]->observe_seconds();
            const double prefill_s = ps.seconds - observing;

            std::vector<size_t> questions;
            if (cfg.query_aware)
                questions = {grp};
            else {
                questions.resize(s.questions.size());
                std::iota(questions.begin(), questions.end(), 0);
            }
            for (size_t c = 0; c < configs.size(); ++c) {
                std::vector<size_t> qs;
                for (size_t qi : questions)
                    if (std::find(todo[c].begin(), todo[c].end(), qi) != todo[c].end() || c == 0) qs.push_back(qi);
                if (qs.empty()) continue;
                reset_peak_rss();
                KvStore cache = base.copy();
                CompressStats st;
                if (c == 0) {
                    cache.fit(reserve);
                } else {
                    st = compress(*presses[c], cache, configs[c].budget.budget(), reserve);
                }
                for (size_t qi : qs) {
                    const std::vector<int32_t> query =
                        cfg.query_aware ? std::vector<int32_t>{prompts[qi].query.back()} : prompts[qi].query;
                    KvStore work = cache.copy();
                    const GenerateResult r = engine.generate(work, query, go);
                    if (c == 0) {  // the baseline: its answer and logits along it
                        full_answers[qi] = r.tokens;
                        full_logits[qi] = teacher_forced(engine, cache, query, r.tokens, n_vocab);
                    }
                    const bool wanted = std::find(todo[c].begin(), todo[c].end(), qi) != todo[c].end();
                    if (!wanted) continue;
                    tick(s.id + " q" + std::to_string(qi) + ": " + configs[c].method + " " + configs[c].label);
                    Fidelity f;
                    f.top1_agreement = 1.0;
                    if (c != 0) {
                        f = fidelity(full_logits[qi], teacher_forced(engine, cache, query, full_answers[qi], n_vocab),
                                     n_vocab);
                    } else {
                        f.n_positions = int64_t(std::max<size_t>(1, r.tokens.size()));
                    }
                    const std::string text = tok.decode(r.tokens);
                    const Question & q = s.questions[qi];
                    nlohmann::json rec = {
                        {"kind", "answer"},
                        {"sample_id", s.id},
                        {"task", s.task},
                        {"question_index", qi},
                        {"question", q.question},
                        {"method", configs[c].method},
                        {"budget_label", configs[c].label},
                        {"ratio", c == 0                          ? nlohmann::json(0.0)
                                  : configs[c].budget.tokens >= 0 ? nlohmann::json()
                                                                  : nlohmann::json(configs[c].budget.ratio)},
                        {"achieved_ratio", achieved_ratio(cache, L)},
                        {"params", c == 0 ? nlohmann::json::object() : presses[c]->params()},
                        {"query_aware", cfg.query_aware},
                        {"metric", s.metric},
                        {"score", score(s.metric, text, q.answers)},
                        {"answer", text},
                        {"answer_tokens", r.tokens.size()},
                        {"references", q.answers},
                        {"fidelity",
                         {{"kl_mean", f.kl_mean},
                          {"kl_max", f.kl_max},
                          {"top1_agreement", f.top1_agreement},
                          {"n_positions", f.n_positions},
                          {"identical", r.tokens == full_answers[qi]}}},
                        {"kv_allocated_bytes", cache.bytes()},
                        {"kv_used_bytes", cache.used_bytes()},
                        {"kept_rows", cache.total_rows()},
                        {"context_tokens", L},
                        {"prefill_s", prefill_s},
                        {"compress_s", st.seconds()},
                        {"compress", c == 0 ? nlohmann::json() : st.to_json()},
                        {"ttft_s", r.ttft_s},
                        {"decode_s", r.decode_s},
                        {"decode_tokens_per_s", r.decode_tokens_per_second()},
                        {"stop_reason", r.stop_reason},
                        {"peak_rss_bytes", mem_info().peak_rss_bytes},
                        {"sample_meta", s.meta}};
                    if (rec["compress"].is_object()) rec["compress"].erase("kept");
                    os << rec.dump() << "\n" << std::flush;
                    ++pr.done;
                }
            }
        }
    }
    tick("done");
    return out;
}

}  // namespace kvlab::eval
