// The evaluation runner: for each context, prefill once (timed) and answer every question
// from the full cache as the baseline; for each method x budget, compress once (timed) and
// answer each question from an independent copy, scoring the answer and its fidelity to
// the full cache. Resumable (records already in the output are skipped) and shardable
// (sample i goes to shard i mod N); one JSONL record per answer (schema in report.h).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "eval/tasks.h"
#include "kvlab/decode_policy.h"
#include "kvlab/press.h"
#include "kvlab/registry.h"

namespace kvlab::eval {

struct MethodConfig {
    std::string name;  // "none" is the full cache
    ParamMap params;
};

// A budget of the experiment: any Budget compress() takes (a ratio, tokens per layer, bytes, each
// with or without demotion).
struct BudgetConfig {
    Budget b;
    static BudgetConfig ratio(double r) { return {Budget::from_ratio(r)}; }
    static BudgetConfig tokens(int64_t t) { return {Budget::from_tokens(t)}; }
    // "ratio 0.5" | "budget 256" | "bytes 0.25" | "kv_bytes 1000000", then " demote q4_0" (and
    // " share 0.5") when it demotes
    std::string label() const;
    Budget budget() const { return b; }
};

// "f16", "q8_0", ... when K and V have one type, else "K/V" ("q8_0/q4_0"); parse_types reads
// both forms (throws kvlab::Error naming the choices).
std::string types_label(ggml_type k, ggml_type v);
std::pair<ggml_type, ggml_type> parse_types(const std::string & label);

struct RunConfig {
    std::string model = "smollm2-135m";
    std::vector<std::string> tasks = {"niah"};  // task names, or "qa:PATH.jsonl"
    TaskOptions task;
    std::vector<std::string> haystack;  // files; empty: the project's data/haystack essays
    std::vector<MethodConfig> methods;  // besides the full cache, which always runs
    std::string preset;                 // "" (kvlab's defaults) or "kvpress" (see apply_preset)
    std::vector<BudgetConfig> budgets;
    bool query_aware = false;
    // KVzip's multi-query setting: compress with the sample's FIRST question in the context
    // (query-aware), forget that question's rows, answer every question from the one cache
    bool multi_turn = false;
    int max_tokens = 32;
    // Compression while decoding, applied to every method x budget and, as a row of its own, to
    // the full cache (which stays the reference without it): the answers and their teacher-forced
    // fidelity go through the same steps and compactions.
    DecodePolicyOptions decode;
    int threads = 0;                // 0: every CPU that other work leaves idle
    std::string products = "auto";  // the weight products' arithmetic: auto, ggml, amx or vnni (kvlab/kernels.h)
    bool repack = true;             // ggml's repacked weight layouts where its CPU backend has them
    int chunk = 512;
    std::string attention = "kvlab";
    std::string cache_type_k = "f16", cache_type_v = "f16";  // the KV row types (-ctk / -ctv)
    bool kv_rotation = true;                                 // CacheTypes::rotate
    // The cache-type axis (types_label form): each context is prefilled once per entry, whose
    // full cache and methods x budgets all run; fidelity is measured against the full cache of
    // the first entry. Empty: the one entry cache_type_k / cache_type_v.
    std::vector<std::string> cache_types;
    std::vector<std::string> cache_type_axis() const;
    std::string out_dir = "kvlab-results";
    int shard = 0, n_shards = 1;

    nlohmann::json to_json() const;
    // Unknown keys and malformed values throw kvlab::Error naming them.
    static RunConfig from_json(const nlohmann::json & j);
};

struct Progress {
    int64_t done = 0, total = 0, skipped = 0;
    double elapsed_s = 0.0;
    std::string what;
};

// What a run takes from its surroundings (the front ends fill it from the environment,
// app/environment.h): where models come from (a short name or path to a GGUF file, fetched when
// needed: app/fetch.h), where file hashes are memoised, and a folder searched first for the
// bundled haystack.
struct RunEnv {
    std::function<std::string(const std::string & name_or_path)> resolve_model;
    std::string hash_cache_dir;
    std::string data_dir;  // "": only beside the executable and the working directory
};

// Runs the configuration; writes <out_dir>/records-<shard>-of-<N>.jsonl (a header record,
// then one record per answer, flushed as they come) and returns the path.
std::string run(const RunConfig & cfg, const RunEnv & env, const std::function<void(const Progress &)> & on_progress);

// The project's bundled haystack (data/haystack/*.txt), found in data_dir (when given), then
// from the executable's or the current directory.
std::vector<std::string> default_haystack(const std::string & data_dir);

}  // namespace kvlab::eval
