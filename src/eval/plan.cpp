#include "eval/plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "eval/report.h"
#include "kvlab/cache.h"
#include "kvlab/decode_policy.h"
#include "kvlab/error.h"
#include "kvlab/press.h"

namespace kvlab::eval {

namespace fs = std::filesystem;

int64_t RunPlan::n_answers() const {
    int64_t n = 0;
    for (const Sample & s : mine) n += int64_t(s.questions.size() * configs.size());
    return n;
}

namespace {

// A run killed while it wrote a record leaves a last line without its newline: that record
// was not finished, so it goes (it is redone); every complete line stays.
void drop_torn_record(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), {}};
    if (bytes.empty() || bytes.back() == '\n') return;
    const size_t keep = bytes.rfind('\n') == std::string::npos ? 0 : bytes.rfind('\n') + 1;
    std::error_code ec;
    fs::resize_file(path, keep, ec);
    if (ec) throw Error("eval", "cannot drop the torn last record of " + path + ": " + ec.message());
    std::fprintf(stderr, "[eval] %s: dropped a torn last record (%zu bytes; an interrupted write), it will be redone\n",
                 path.c_str(), bytes.size() - keep);
}

// The curve a configuration belongs to: its cache types and what happens to the rows its budget
// does not keep at them ("f16 evict", "f16 demote q4_0", "q8_0 demote q4_0 share 0.5").
std::string precision_policy(const std::string & types, const Budget & b) {
    std::ostringstream o;
    o << types << (b.demotes() ? std::string(" demote ") + cache_type_name(b.demote) : std::string(" evict"));
    if (b.demotes() && b.high_share >= 0.0) o << " share " << b.high_share;
    return o.str();
}

}  // namespace

RunPlan plan_run(const RunConfig & cfg, const Model & model, const Tokenizer & tok, const std::string & data_dir) {
    if (cfg.n_shards < 1 || cfg.shard < 0 || cfg.shard >= cfg.n_shards)
        throw Error("eval", "shard must be i/N with 0 <= i < N, got " + std::to_string(cfg.shard) + "/" +
                                std::to_string(cfg.n_shards));
    if (cfg.max_tokens < 1) throw Error("eval", "max_tokens must be at least 1");
    if (!cfg.methods.empty() && cfg.budgets.empty()) throw Error("eval", "methods need at least one budget");
    for (const auto & m : cfg.methods)  // validate before any work
        make_press(m.name, apply_preset(cfg.preset, m.name, m.params), model);
    const bool decoding = cfg.decode.method != "none";
    if (decoding) DecodePolicy check(cfg.decode, model);  // its options and kvzap's scorer, before any work
    // compression while decoding names itself in the rows: runs with different policies merge
    // into one report
    const std::string decode = decoding ? " decode " + cfg.decode.label() : "";
    RunPlan plan;
    const std::vector<std::string> axis = cfg.cache_type_axis();
    for (size_t i = 0; i < axis.size(); ++i)
        if (std::find(axis.begin(), axis.begin() + long(i), axis[i]) != axis.begin() + long(i))
            throw Error("eval", "cache type '" + axis[i] + "' appears twice in cache_types");
    for (const std::string & t : axis) {
        parse_types(t);
        const std::string suffix = t == "f16" ? "" : " kv " + t;
        plan.configs.push_back({"none", "full" + suffix, -1, {}, t, t + " full"});
        // the policy alone: the full cache, compressed while it answers
        if (decoding) plan.configs.push_back({"none", "full" + suffix + decode, -1, {}, t, t + " full", true});
        const auto [k, v] = parse_types(t);
        for (size_t m = 0; m < cfg.methods.size(); ++m)
            for (const auto & b : cfg.budgets) {
                if (b.b.demotes() && !demotion_saves(k, v, b.b.demote, model.hparams().head_dim)) {
                    if (m == 0)
                        std::fprintf(stderr, "[eval] skipped: %s in a %s cache (demoting frees nothing there)\n",
                                     b.label().c_str(), t.c_str());
                    continue;
                }
                plan.configs.push_back({cfg.methods[m].name, b.label() + suffix + decode, int(m), b, t,
                                        precision_policy(t, b.b), decoding});
            }
    }

    const Haystack hay = load_haystack(cfg.haystack.empty() ? default_haystack(data_dir) : cfg.haystack);
    const TokenCounter count = [&](const std::string & s) { return int64_t(tok.encode(s, false).size()); };
    std::vector<Sample> samples;
    for (const std::string & t : cfg.tasks) {
        std::vector<Sample> s =
            t.rfind("qa:", 0) == 0 ? load_qa_jsonl(t.substr(3)) : make_task(t, cfg.task, hay, count);
        samples.insert(samples.end(), s.begin(), s.end());
    }
    plan.n_samples = samples.size();
    for (size_t i = 0; i < samples.size(); ++i)
        if (int(i % cfg.n_shards) == cfg.shard) plan.mine.push_back(samples[i]);

    plan.out_path = (fs::path(cfg.out_dir) /
                     ("records-" + std::to_string(cfg.shard) + "-of-" + std::to_string(cfg.n_shards) + ".jsonl"))
                        .string();
    if (fs::exists(plan.out_path)) drop_torn_record(plan.out_path);
    if (fs::exists(plan.out_path))
        for (const auto & r : read_records({plan.out_path}))
            if (r.value("kind", "") == "answer")
                plan.done.insert({r["sample_id"], r["question_index"], r["method"], r["budget_label"]});
    return plan;
}

std::ofstream open_records(const RunPlan & plan, const RunConfig & cfg, const nlohmann::json & provenance) {
    std::error_code ec;
    fs::create_directories(cfg.out_dir, ec);
    if (ec) throw Error("eval", "cannot create " + cfg.out_dir + ": " + ec.message());
    std::ofstream os(plan.out_path, std::ios::app);
    if (!os) throw Error("eval", "cannot write " + plan.out_path);
    if (fs::file_size(plan.out_path, ec) == 0 && !ec) {  // a new file: the header first
        nlohmann::json header = {{"kind", "header"},
                                 {"config", cfg.to_json()},
                                 {"shard", std::to_string(cfg.shard) + "/" + std::to_string(cfg.n_shards)},
                                 {"n_samples", plan.n_samples},
                                 {"provenance", provenance}};
        os << header.dump() << "\n" << std::flush;
    }
    return os;
}

}  // namespace kvlab::eval
