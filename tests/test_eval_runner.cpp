// The evaluation runner on a tiny random-weight model: records are complete and
// deterministic; an interrupted run resumes to the same records; shards merged give the
// same records as one unsharded run; the report is produced from a small run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "app/fetch.h"
#include "environment.h"
#include "eval/report.h"
#include "eval/runner.h"
#include "kvlab/error.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

namespace kvlab {
namespace {

// The run's surroundings as the kvlab binary takes them (tools/environment.h).
eval::RunEnv env() {
    const cli::Environment & e = cli::environment();
    return {[&e](const std::string & m) { return resolve_model(m, e.models); }, e.cache_dir, e.data_dir};
}

namespace fs = std::filesystem;

class EvalRunner : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(test::temp_dir("eval"));
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_layer = 2;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.weight_type = GGML_TYPE_Q8_0;
        spec.seed = 5;
        model_ = new std::string(test::write_tiny_gguf(spec, test::default_model_path(), *dir_ + "/tiny.gguf"));
    }
    static void TearDownTestSuite() {
        fs::remove_all(*dir_);
        delete dir_;
        delete model_;
    }
    static eval::RunConfig config(const std::string & out) {
        eval::RunConfig c;
        c.model = *model_;
        c.tasks = {"niah", "ruler_niah_multikey"};
        c.task.lengths = {256};
        c.task.depths = {0.2, 0.8};
        c.haystack = {test::source_dir() + "/data/haystack/avg.txt", test::source_dir() + "/data/haystack/apple.txt"};
        c.methods = {{"snapkv", {{"window", "8"}}}, {"streaming_llm", {}}, {"adakv", {{"window", "8"}}}};
        c.budgets = {eval::BudgetConfig::ratio(0.5), eval::BudgetConfig::tokens(64)};
        c.max_tokens = 4;
        c.threads = 2;
        c.out_dir = out;
        return c;
    }
    // Answer records keyed by (sample, question, method, budget), timing fields removed.
    static std::map<std::string, nlohmann::json> answers(const std::vector<std::string> & files) {
        std::map<std::string, nlohmann::json> m;
        for (auto r : eval::read_records(files)) {
            if (r["kind"] != "answer") continue;
            for (const char * k :
                 {"prefill_s", "compress_s", "ttft_s", "decode_s", "decode_tokens_per_s", "peak_rss_bytes", "compress"})
                r.erase(k);
            const std::string key = r["sample_id"].get<std::string>() + "|" + r["question_index"].dump() + "|" +
                                    r["method"].get<std::string>() + "|" + r["budget_label"].get<std::string>();
            EXPECT_EQ(m.count(key), 0u) << "duplicate record " << key;
            m[key] = r;
        }
        return m;
    }
    static inline std::string * dir_ = nullptr;
    static inline std::string * model_ = nullptr;
};

TEST_F(EvalRunner, ShardsResumeAndReport) {
    // one unsharded run: every (sample, question) x (full + 3 methods x 2 budgets)
    const std::string full_dir = *dir_ + "/full";
    const std::string out = eval::run(config(full_dir), env(), nullptr);
    const auto all = answers({out});
    ASSERT_FALSE(all.empty());
    std::map<std::string, int> per_config;
    std::map<std::string, uint64_t> full_bytes;  // per sample
    for (const auto & [k, r] : all)
        if (r["method"] == "none") full_bytes[r["sample_id"]] = r["kv_allocated_bytes"].get<uint64_t>();
    for (const auto & [k, r] : all) {
        ++per_config[r["method"].get<std::string>() + " " + r["budget_label"].get<std::string>()];
        if (r["method"] == "none") {
            EXPECT_EQ(r["fidelity"]["kl_mean"].get<double>(), 0.0);
            EXPECT_TRUE(r["fidelity"]["identical"].get<bool>());
            EXPECT_EQ(r["kv_allocated_bytes"].get<uint64_t>(), full_bytes[r["sample_id"]]) << k;
        } else {
            EXPECT_GT(r["achieved_ratio"].get<double>(), 0.3) << k;
            // the same reserve as the full cache: fewer rows, fewer bytes
            EXPECT_LT(r["kv_allocated_bytes"].get<uint64_t>(), full_bytes[r["sample_id"]]) << k;
        }
    }
    EXPECT_EQ(per_config.size(), 7u);
    const int n = per_config["none full"];
    for (const auto & [cfg, count] : per_config) EXPECT_EQ(count, n) << cfg;

    // interrupted after a few records, then resumed: the same records
    const std::string cut_dir = *dir_ + "/cut";
    fs::create_directories(cut_dir);
    {
        std::ifstream in(out);
        std::ofstream cut(cut_dir + "/records-0-of-1.jsonl");
        std::string line;
        for (int i = 0; i < 6 && std::getline(in, line); ++i) cut << line << "\n";
    }
    const std::string resumed = eval::run(config(cut_dir), env(), nullptr);
    EXPECT_EQ(answers({resumed}), all);

    // two shards merged: the same records as the unsharded run
    std::vector<std::string> shard_files;
    for (int i = 0; i < 2; ++i) {
        eval::RunConfig c = config(*dir_ + "/sharded");
        c.shard = i;
        c.n_shards = 2;
        shard_files.push_back(eval::run(c, env(), nullptr));
    }
    EXPECT_EQ(answers(shard_files), all);

    // the report of the small run
    std::vector<nlohmann::json> recs;
    for (const auto & r : eval::read_records({out}))
        if (r["kind"] == "answer") recs.push_back(r);
    const auto rows = eval::summarize(recs);
    ASSERT_EQ(rows.size(), 7u);
    EXPECT_EQ(rows[0].method, "none");
    const std::string html = eval::html_report(rows, eval::read_records({out})[0]);
    for (const char * m : {"snapkv", "streaming_llm", "adakv", "<svg", "<table"})
        EXPECT_NE(html.find(m), std::string::npos) << m;
}

TEST_F(EvalRunner, QueryAwareCompressesContextAndQuestion) {
    eval::RunConfig c = config(*dir_ + "/qa");
    c.tasks = {"niah"};
    c.task.depths = {0.5};
    c.methods = {{"snapkv", {{"window", "8"}}}};
    c.budgets = {eval::BudgetConfig::ratio(0.5)};
    c.query_aware = true;
    const auto rec = answers({eval::run(c, env(), nullptr)});
    ASSERT_EQ(rec.size(), 2u);  // the full cache and snapkv, one question
    eval::RunConfig agnostic = c;
    agnostic.query_aware = false;
    agnostic.out_dir = *dir_ + "/qa-agnostic";
    const auto ag = answers({eval::run(agnostic, env(), nullptr)});
    for (const auto & [k, r] : rec) {
        EXPECT_TRUE(r["query_aware"].get<bool>());
        // the context holds the question too (all but its last token, fed as the query)
        EXPECT_GT(r["context_tokens"].get<int64_t>(), ag.at(k)["context_tokens"].get<int64_t>()) << k;
    }
}

// kill -9 in the middle of a run, then a torn last line (a write cut short), then resume:
// the records are complete, none is duplicated or torn, and they equal an uninterrupted run's.
TEST_F(EvalRunner, KilledRunsResumeToCompleteRecords) {
    const std::string cmd = test::kvlab_binary() + " eval " + *model_ +
                            " --tasks niah,ruler_niah_multikey --lengths 256 --depths 0.2,0.5,0.8 --methods "
                            "snapkv,streaming_llm --param snapkv:window=8 --ratios 0.5,0.75 -n 4 -t 2 --out ";
    const std::string clean = *dir_ + "/clean", killed = *dir_ + "/killed";
    const auto first = test::run_command(cmd + clean);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const auto want = answers({clean + "/records-0-of-1.jsonl"});
    const std::string rec = killed + "/records-0-of-1.jsonl";
    const auto n_lines = [&] {
        std::ifstream in(rec);
        return std::count(std::istreambuf_iterator<char>(in), {}, '\n');
    };
    // 1. SIGKILL once a few records are written
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", ("exec " + cmd + killed + " > /dev/null 2>&1").c_str(), nullptr);
        _exit(127);
    }
    for (int i = 0; i < 6000 && n_lines() < 6; ++i) usleep(10000);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFSIGNALED(st)) << "the run ended before it was killed";
    // 2. the last record cut in half, as a kill inside its write leaves it
    std::string bytes;
    {
        std::ifstream in(rec, std::ios::binary);
        bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const size_t last = bytes.rfind('\n', bytes.size() - 2);
    ASSERT_NE(last, std::string::npos);
    fs::resize_file(rec, last + 1 + (bytes.size() - last - 1) / 2);
    // 3. resume
    const auto r = test::run_command(cmd + killed);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("dropped a torn last record"), std::string::npos) << r.output;
    const auto got = answers({rec});  // every line parses; answers() fails on a duplicate
    EXPECT_EQ(got.size(), want.size());
    for (const auto & [k, v] : want) {
        ASSERT_TRUE(got.count(k)) << "missing " << k;
        EXPECT_EQ(got.at(k)["answer"], v["answer"]) << k;
        EXPECT_EQ(got.at(k)["score"], v["score"]) << k;
    }
}

TEST_F(EvalRunner, MultiTurnCompressesWithTheFirstQuestionAndAnswersAllFromOneCache) {
    eval::RunConfig c = config(*dir_ + "/multi");
    c.tasks = {"many_facts"};
    c.task.lengths = {400};
    c.methods = {{"snapkv", {{"window", "8"}}}, {"kvzip", {{"chunk", "128"}}}};
    c.budgets = {eval::BudgetConfig::ratio(0.5)};
    c.multi_turn = true;
    const auto rec = answers({eval::run(c, env(), nullptr)});
    ASSERT_EQ(rec.size(), 18u);  // six questions x (full, snapkv, kvzip), all from one prefill
    eval::RunConfig agnostic = c;
    agnostic.multi_turn = false;
    agnostic.out_dir = *dir_ + "/multi-agnostic";
    const auto ag = answers({eval::run(agnostic, env(), nullptr)});
    ASSERT_EQ(ag.size(), 18u);
    bool snapkv_differs = false;
    for (const auto & [k, r] : rec) {
        EXPECT_TRUE(r["multi_turn"].get<bool>());
        // the first question's rows are forgotten: the cache holds the context alone
        EXPECT_EQ(r["context_tokens"], ag.at(k)["context_tokens"]) << k;
        if (r["method"] == "none") {  // the same cache, the same answers
            EXPECT_EQ(r["kv_used_bytes"], ag.at(k)["kv_used_bytes"]) << k;
            EXPECT_EQ(r["answer"], ag.at(k)["answer"]) << k;
        } else {  // at least the context's budget (rows of the question the method dropped go to the context)
            EXPECT_GE(r["kv_used_bytes"].get<int64_t>(), ag.at(k)["kv_used_bytes"].get<int64_t>()) << k;
        }
        if (r["method"] == "snapkv") snapkv_differs = snapkv_differs || r["fidelity"] != ag.at(k)["fidelity"];
    }
    EXPECT_TRUE(snapkv_differs) << "snapkv's window held the first question";
    const auto rows = eval::summarize(eval::read_records({*dir_ + "/multi/records-0-of-1.jsonl"}));
    for (const auto & r : rows) EXPECT_EQ(r.n_later, 5) << r.method;  // questions 2..6 of the one sample
}

// The memory axes: byte budgets with and without demotion, and a cache-type axis (one prefill
// per entry; fidelity against the first entry's full cache). Every record carries its bytes as a
// share of the F16 full cache, within its byte budget; the report names the best configuration
// within each byte budget.
TEST_F(EvalRunner, ByteBudgetsAndCacheTypesAreAxes) {
    test::TinySpec spec;
    spec.arch = "llama";
    spec.n_layer = 2;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_embd = 128;
    spec.head_dim = 64;  // whole Q8_0 / Q4_0 blocks, rotated
    spec.weight_type = GGML_TYPE_Q8_0;
    spec.seed = 6;
    eval::RunConfig c = config(*dir_ + "/bytes");
    c.model = test::write_tiny_gguf(spec, test::default_model_path(), *dir_ + "/tiny64.gguf");
    c.tasks = {"niah"};
    c.task.depths = {0.5};
    c.methods = {{"snapkv", {{"window", "8"}}}, {"streaming_llm", {}}};
    Budget demote = Budget::from_bytes_ratio(0.25);
    demote.set_demotion(GGML_TYPE_Q4_0, -1.0);
    c.budgets = {{Budget::from_bytes_ratio(0.25)}, {demote}};
    c.cache_types = {"f16", "q8_0", "q4_0"};  // q4_0: demoting to q4_0 frees nothing there, skipped
    const eval::RunConfig back = eval::RunConfig::from_json(c.to_json());
    EXPECT_EQ(back.cache_types, c.cache_types);
    ASSERT_EQ(back.budgets.size(), 2u);
    EXPECT_EQ(back.budgets[1].label(), "bytes 0.25 demote q4_0");
    const auto rec = answers({eval::run(c, env(), nullptr)});
    std::map<std::string, int> labels;
    for (const auto & [k, r] : rec) {
        const std::string label = r["budget_label"].get<std::string>();
        ++labels[r["method"].get<std::string>() + " " + label];
        const std::string t = label.find("kv q8_0") != std::string::npos   ? "q8_0"
                              : label.find("kv q4_0") != std::string::npos ? "q4_0"
                                                                           : "f16";
        EXPECT_EQ(r["cache_type_k"], t) << k;
        EXPECT_EQ(r["cache_types"], t) << k;
        const double bytes = r["kv_bytes_ratio"].get<double>();
        if (r["method"] == "none") {
            EXPECT_EQ(bytes, t == "q8_0" ? 34.0 / 64.0 : t == "q4_0" ? 18.0 / 64.0 : 1.0) << k;
            EXPECT_EQ(r["policy"], t + " full") << k;
            if (t != "f16") EXPECT_GT(r["fidelity"]["n_positions"].get<int64_t>(), 0) << k;
            continue;
        }
        EXPECT_EQ(r["budget_bytes_ratio"].get<double>(), 0.25) << k;
        EXPECT_LE(bytes, 0.25) << k;
        EXPECT_GT(bytes, 0.2) << k;
        const bool demoted = label.find("demote") != std::string::npos;
        EXPECT_EQ(r["rows_demoted"].get<int64_t>() > 0, demoted) << k;
        EXPECT_FALSE(demoted && t == "q4_0") << k;
        EXPECT_EQ(r["policy"], t + (demoted ? " demote q4_0" : " evict")) << k;
    }
    // f16 and q8_0: the full cache and 2 methods x 2 budgets; q4_0: the full cache and 2 methods x 1
    EXPECT_EQ(labels.size(), 13u);
    for (const auto & [l, n] : labels) EXPECT_EQ(n, labels["none full"]) << l;
    std::vector<nlohmann::json> recs;
    for (const auto & [k, r] : rec) recs.push_back(r);
    const auto rows = eval::summarize(recs);
    const std::string best = eval::best_per_bytes(rows);
    EXPECT_NE(best.find("best within 25.0% of the F16 full cache's bytes: "), std::string::npos) << best;
    EXPECT_NE(eval::svg_score_vs_bytes(rows).find("snapkv \u00b7 f16 demote q4_0"), std::string::npos);
}

}  // namespace
}  // namespace kvlab

namespace kvlab {
namespace {

// Long generation under a decoding policy: every answer takes its full length, the methods'
// caches stay within the policy's bound all along (their peak far below the full cache's),
// and fidelity is measured along the full cache's whole continuation.
TEST_F(EvalRunner, LongGenerationUnderADecodingPolicy) {
    eval::RunConfig c = config(*dir_ + "/long");
    c.tasks = {"long_continuation"};
    c.task.n_samples = 1;
    c.task.long_tokens = 200;
    c.methods = {{"streaming_llm", {}}};
    c.budgets = {eval::BudgetConfig::ratio(0.0), eval::BudgetConfig::ratio(0.5)};
    c.decode.method = "knorm";
    c.decode.interval = 16;
    c.decode.target = 48;
    const eval::RunConfig back = eval::RunConfig::from_json(c.to_json());
    EXPECT_EQ(back.decode.to_json(), c.decode.to_json());
    EXPECT_EQ(back.decode.target, 48);
    EXPECT_EQ(back.task.long_tokens, 200);
    const auto rec = answers({eval::run(c, env(), nullptr)});
    ASSERT_EQ(rec.size(), 4u);  // the full cache with and without the policy, the method at 2 ratios
    uint64_t full_peak = 0, row_bytes = 0;
    for (const auto & [k, r] : rec) {
        SCOPED_TRACE(k);
        EXPECT_EQ(r["answer_tokens"].get<int64_t>(), 200);
        EXPECT_EQ(r["fidelity"]["n_positions"].get<int64_t>(), 200);
        EXPECT_EQ(r["score"].get<double>(), r["fidelity"]["top1_agreement"].get<double>());
        if (r["method"] == "none" && r["budget_label"] == "full") {
            EXPECT_TRUE(r["decode_policy"].is_null());
            EXPECT_EQ(r["score"].get<double>(), 1.0);
            full_peak = r["kv_peak_bytes"].get<uint64_t>();
            continue;
        }
        const nlohmann::json & d = r["decode_policy"];
        ASSERT_TRUE(d.is_object());
        EXPECT_NE(r["budget_label"].get<std::string>().find(" decode knorm target 48 interval 16"), std::string::npos);
        EXPECT_GE(d["compactions"].get<int64_t>(), 200 / 16);
        EXPECT_LT(d["max_segment_rows"].get<int64_t>(), 48 + 16);
        EXPECT_GT(d["rows_dropped"].get<int64_t>(), 0);
        EXPECT_LT(r["kv_peak_bytes"].get<uint64_t>(), full_peak) << "bounded while the full cache grows";
        row_bytes = r["kv_peak_bytes"].get<uint64_t>();
    }
    EXPECT_GT(full_peak, 0u);
    EXPECT_GT(row_bytes, 0u);
    EXPECT_TRUE(rec.count(rec.begin()->first.substr(0, rec.begin()->first.find('|')) +
                          "|0|none|full decode knorm target 48 interval 16"));

    c.decode.target = 8;  // below the sinks and window it keeps: refused before any work
    EXPECT_THROW(eval::run(c, env(), nullptr), Error);
}

}  // namespace
}  // namespace kvlab
