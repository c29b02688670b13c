// The context session: the one flow every command runs (docs/design.md, seed flow). Prefill a
// context once with the observers of every requested method (each method's observing
// time its own), then prepare caches from it — the full cache (the baseline) or a copy
// compressed by one method at one budget, all with ONE reserve policy — and answer each
// query from an independent copy, with every timing and byte count.
//
//   ContextSession s(engine, {{"snapkv", {}}}, SessionOptions{max_query, max_tokens});
//   s.prefill(context);
//   PreparedCache full = s.full(), small = s.compress(0, Budget::from_ratio(0.5));
//   GenerateResult r = s.answer(small.cache, query, go);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "kvlab/engine.h"
#include "kvlab/press.h"
#include "kvlab/text.h"

namespace kvlab {

// A compression method by name with its parameters (`kvlab methods`).
struct MethodRequest {
    std::string name;
    ParamMap params;
};

struct SessionOptions {
    int64_t max_query_tokens = 0;           // the longest query fed on top of a prepared cache
    int64_t max_answer_tokens = 0;          // the most tokens an answer may take
    const Tokenizer * tok = nullptr;        // the prompts of methods with scoring passes (kvzip)
    std::optional<CacheTypes> cache_types;  // the context's K/V row types; unset: the engine's
};

// The reserve policy: every prepared cache (full or compressed) keeps room for the longest
// query and the longest answer after it, so that answering (and teacher-forcing an answer
// for fidelity) never grows the store. One rule for every command: "KV allocated" of the
// same work is the same in `ask`, `eval`, `bench-methods` and later the server.
int64_t answer_reserve(const SessionOptions & o);

// A cache ready to answer from, and what preparing it cost.
struct PreparedCache {
    KvStore cache;
    CompressStats stats;  // rows and bytes before / after; times are 0 for the full cache
    std::string method;   // "none" for the full cache
};

// How a question meets its context. Query-agnostic: the context is compressed alone and
// the question's tokens are the query. Query-aware: the question (all but its last token)
// joins the context before compression, and its last token is the query.
struct ContextQuery {
    std::vector<int32_t> context, query;
};
ContextQuery split_query(const Tokenizer::SplitPrompt & prompt, bool query_aware);

class ContextSession {
public:
    // Validates the methods and their parameters (throws kvlab::Error naming them).
    ContextSession(Engine & engine, const std::vector<MethodRequest> & methods, SessionOptions opts);
    // One press the caller made and keeps (a callback press: include/kvlab/callback_press.h); it
    // must outlive the session.
    ContextSession(Engine & engine, Press & press, SessionOptions opts);
    ContextSession(const ContextSession &) = delete;
    ContextSession & operator=(const ContextSession &) = delete;

    // Prefills the context into a fresh cache; every method's observer sees its queries.
    // Throws when the context plus the reserve exceed the model's context. Once per session.
    void prefill(const std::vector<int32_t> & context);
    void check_presses() const;

    // Prefill figures: seconds is the model's part (the methods' observing excluded).
    const PrefillStats & prefill_stats() const { return prefill_; }
    int64_t context_tokens() const { return prefill_.n_tokens; }
    int64_t reserve() const { return reserve_; }
    size_t n_methods() const { return presses_.size(); }
    const Press & press(size_t i) const { return *presses_.at(i); }
    // Seconds method i spent scoring inside the prefill (counted in its compression time).
    double observe_seconds(size_t i) const { return presses_.at(i)->observe_seconds(); }
    const KvStore & prefilled() const;

    // A copy of the full cache, fitted to the reserve (the baseline).
    PreparedCache full() const;
    // A copy compressed by method i at the budget (the observation is reused: one prefill
    // serves every budget of every method).
    PreparedCache compress(size_t method, const Budget & budget);
    // The prefilled cache itself compressed by method i (no copy: the peak is one cache); the
    // session holds no prefilled cache afterwards.
    PreparedCache compress_prefilled(size_t method, const Budget & budget);

    // Answers from an independent copy of `cache` (which stays unchanged).
    GenerateResult answer(const KvStore & cache, const std::vector<int32_t> & query, const GenerateOptions & go) const;
    // The next-token logits [max(1, |answer|)][n_vocab] along `answer` teacher-forced after
    // `query`, from an independent copy of `cache`: row t predicts answer[t]. With a decoding
    // hook (compression while decoding), the answer is fed token by token through the same
    // steps and compactions as a generation; without, in one prefill.
    std::vector<float> teacher_forced(const KvStore & cache, const std::vector<int32_t> & query,
                                      const std::vector<int32_t> & answer, const DecodeHook * hook = nullptr) const;

private:
    Engine & engine_;
    SessionOptions opts_;
    int64_t reserve_ = 0;
    std::vector<std::unique_ptr<Press>> owned_;
    std::vector<Press *> presses_;
    std::unique_ptr<KvStore> base_;  // the prefilled context (null before prefill)
    PrefillStats prefill_;
};

// 1 - rows held / (context rows x layers x heads).
double achieved_ratio(const KvStore & cache, int64_t context_rows);

}  // namespace kvlab
