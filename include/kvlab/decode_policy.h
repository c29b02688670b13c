// Compression while decoding (docs/methods.md "Compression during decoding"; kvpress
// DecodingPress and DMSPress): a long generation no longer grows the cache without bound.
//
//   knorm, keydiff, streaming_llm (DecodingPress): at the first generated token, then every
//     `interval` generated tokens, each
//     (layer, KV head) segment of a global layer holding more than `target` rows keeps its
//     `n_sink` first and `window` last rows and the best others by the method's score of its
//     rows (key norms, key diversity, recency), `target` in all;
//   tova (TOVA's rule, accumulated over the interval): at the same steps, the same rows kept,
//     each scored by its attention from the queries of the tokens decoded since the last
//     compression (a query counts for the rows it saw), averaged over those queries and the
//     KV head's group of query heads; with interval 1, exactly TOVA (the last token's attention);
//   kvzap with a threshold (DMSPress): at the same steps, the generated rows
//     older than the `window` last rows whose predicted log KVzip+ score (from the hidden state
//     of their own decoding step) is below the threshold are dropped; the context's rows stay.
//
// Dropped rows are freed (KvStore::compact, positions stay original); from the first generated
// token on, the cache holds at most target + interval - 1 rows per segment (knorm, keydiff,
// streaming_llm, tova) after every step.
// Sliding-window layers keep their own window.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvlab/engine.h"
#include "kvlab/press.h"

namespace kvlab {

struct DecodePolicyOptions {
    std::string method = "none";  // none, knorm, keydiff, streaming_llm, tova, kvzap
    ParamMap params;              // kvzap: scorer, kind, threshold (required), window
    int64_t interval = 64;        // generated tokens between compressions
    int64_t target = 1024;        // rows per segment after each compression (not kvzap)
    int64_t n_sink = 4;           // first rows every segment keeps (not kvzap)
    int64_t window = 16;          // last rows every segment keeps (kvzap: its `window` parameter)
    nlohmann::json to_json() const;
    // "" for none; "knorm target 512 interval 64", "kvzap threshold -6 interval 64": what a
    // report's row names
    std::string label() const;
};

// The methods a decoding policy takes.
std::vector<std::string> decode_policy_methods();

// The most rows a segment gains while generating max_tokens under the policy: what a cache
// that answers needs reserved beyond its query.
int64_t decode_growth(const DecodePolicyOptions & o, int64_t max_tokens);

class Surrogate;

class DecodePolicy {
public:
    // Throws kvlab::Error for an unknown method, a kvzap without a threshold or its scorer, or
    // values out of range. kvzap: `scorer` when given (loaded once, shared by the policies of
    // a server's requests), else the one its parameters name.
    DecodePolicy(const DecodePolicyOptions & o, const Model & model, std::shared_ptr<const Surrogate> scorer = {});
    ~DecodePolicy();
    DecodePolicy(const DecodePolicy &) = delete;
    DecodePolicy & operator=(const DecodePolicy &) = delete;

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
    // kvzap: the scorer in use (null for the other methods).
    std::shared_ptr<const Surrogate> scorer() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace kvlab
