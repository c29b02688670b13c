// Planning an evaluation run (internal to the runner): the samples of this shard, the
// (method, budget) configurations, what earlier runs already recorded (resume), and the
// output file with its header record.
#pragma once

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "eval/runner.h"
#include "kvlab/model.h"
#include "kvlab/text.h"

namespace kvlab::eval {

// One configuration answered for every question: the full cache, or method × budget, at one
// entry of the cache-type axis.
struct EvalConfig {
    std::string method, label;  // "none", "full" for the full cache (a label names the cache types when not f16)
    int method_index = -1;      // into RunConfig::methods; -1 for the full cache
    BudgetConfig budget;
    std::string types;      // the cache-type axis entry ("f16", "q8_0", "q8_0/q4_0")
    std::string policy;     // the precision policy, a curve of the report: "f16 evict", "f16 demote q4_0", "q8_0 full"
    bool decoding = false;  // compressed while decoding (RunConfig::decode)
    bool is_full() const { return method_index < 0; }
};

// The identity of an answer record.
struct RecordKey {
    std::string sample;
    int64_t question;
    std::string method, budget;
    bool operator<(const RecordKey & o) const {
        return std::tie(sample, question, method, budget) < std::tie(o.sample, o.question, o.method, o.budget);
    }
};

struct RunPlan {
    size_t n_samples = 0;             // over all shards
    std::vector<Sample> mine;         // this shard's samples (sample k goes to shard k mod N)
    std::vector<EvalConfig> configs;  // [0] is the full cache
    std::set<RecordKey> done;         // answers already in the output file
    std::string out_path;
    int64_t n_answers() const;  // answers this shard owes, done ones included
};

// Validates the configuration and the methods, generates the samples, reads what is done.
RunPlan plan_run(const RunConfig & cfg, const Model & model, const Tokenizer & tok, const std::string & data_dir);

// Opens the output for appending; writes the header record when the file is new.
std::ofstream open_records(const RunPlan & plan, const RunConfig & cfg, const nlohmann::json & provenance);

}  // namespace kvlab::eval
