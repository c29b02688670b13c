// Compression while decoding (docs/methods.md "Compression during decoding"; kvpress
// DecodingPress and DMSPress): a long generation no longer grows the cache without bound.
//
// Any registered method that scores segments while decoding (press::SegmentScorer: knorm,
// keydiff, streaming_llm, tova, kvzap today; `kvlab methods` lists them) takes part; the policy
// decides when and selects the rows, the method only scores them:
//   a row target: at the first generated token, then every `interval` generated tokens, each
//     (layer, KV head) segment of a global layer holding more than `target` rows keeps its
//     `n_sink` first and `window` last rows and the best others by the method's scores, `target`
//     in all;
//   the method's threshold (kvzap: DMSPress): at the same steps, the rows older than the method's
//     `window` last positions that it scores below its threshold are dropped.
//
// Dropped rows are freed (KvStore::compact, positions stay original); from the first generated
// token on, a target bounds every segment at target + interval - 1 rows after every step.
// Sliding-window layers keep their own window.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvlab/engine.h"
#include "kvlab/press.h"

namespace kvlab {

struct DecodePolicyOptions {
    std::string method = "none";  // none, or a method that scores while decoding (decode_policy_methods())
    ParamMap params;              // the method's parameters while decoding (kvzap: scorer, kind, threshold, window)
    int64_t interval = 64;        // generated tokens between compressions
    int64_t target = 1024;        // rows per segment after each compression (not with a threshold)
    int64_t n_sink = 4;           // first rows every segment keeps (not with a threshold)
    int64_t window = 16;          // last rows every segment keeps (with a threshold: the method's own)
    nlohmann::json to_json() const;
    // "" for none; "knorm target 512 interval 64", "kvzap threshold -6 interval 64": what a
    // report's row names
    std::string label() const;
};

// The methods a decoding policy takes: "none" and every registered method that scores while decoding.
std::vector<std::string> decode_policy_methods();

// The most rows a segment gains while generating max_tokens under the policy: what a cache
// that answers needs reserved beyond its query.
int64_t decode_growth(const DecodePolicyOptions & o, int64_t max_tokens);

class DecodePolicy {
public:
    // Throws kvlab::Error for a method that cannot score while decoding, parameters it refuses
    // (kvzap: without a threshold or its scorer), or values out of range.
    DecodePolicy(const DecodePolicyOptions & o, const Model & model);
    ~DecodePolicy();
    DecodePolicy(const DecodePolicy &) = delete;
    DecodePolicy & operator=(const DecodePolicy &) = delete;
    // A policy with the same options for another generation, sharing what this one loaded
    // (kvzap's scorer): a server's requests each take one.
    std::unique_ptr<DecodePolicy> another() const;

    // The hook for GenerateOptions::decode (valid while this object lives). One generation at a
    // time: start() before each (the positions it scores from are that generation's).
    const DecodeHook & hook() const;
    void start(const KvStore & cache);

    struct Stats {
        int64_t compactions = 0;
        int64_t rows_dropped = 0;
        int64_t max_segment_rows = 0;  // the most rows any segment held after any step
        uint64_t max_bytes = 0;        // the most bytes the cache held allocated after any step
        double seconds = 0.0;          // scoring and compacting
        nlohmann::json to_json() const;
    };
    const Stats & stats() const;

private:
    struct Impl;
    explicit DecodePolicy(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace kvlab
