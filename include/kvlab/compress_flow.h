// The one flow that makes a stored context, shared by `kvlab compress` and the server's
// POST /v1/contexts: the context's chat tokens, one prefill observed by the method, the cache
// compressed at the budget (or kept full), and the facts a cache file's info records about it.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/session.h"

namespace kvlab {

struct ContextJob {
    std::string text;                       // the document
    std::vector<ChatMessage> before;        // messages before it (a system prompt), may be empty
    std::string method = "none";            // "none": the full cache
    ParamMap params;                        // the method's, after the preset
    std::string preset;                     // "" or "kvpress", recorded
    std::optional<Budget> budget;           // required with a method, refused without one
    std::vector<int32_t> tokens;            // when not empty: context_tokens() of this job, made already
    std::optional<CacheTypes> cache_types;  // the K/V row types; unset: the engine's
};

struct MadeContext {
    std::vector<int32_t> tokens;  // the context's tokens, as prefilled
    PreparedCache prepared;       // the cache: rows only, no reserve (a reader sizes its own)
    PrefillStats prefill;
    // method, params, budget, preset, before, tokens, rows_kept, rows_full, cache_type_k, cache_type_v,
    // kv_bytes, kv_bytes_full (the full cache in the same types), kv_bytes_full_f16, achieved_ratio,
    // timings {prefill_s, prefill_tokens_per_s, compress_s}
    nlohmann::json info;
};

// The chat tokens of job's context: the messages before it, the text as a user turn (the
// questions follow it). Throws kvlab::Error("context", ...) when they leave no room in the
// model's context.
std::vector<int32_t> context_tokens(const Tokenizer & tok, const Model & model, const ContextJob & job);

// Makes the context on `engine`: tokens (context_tokens), prefill, compression. on_phase, when
// set, hears "prefill" and "compress" as each starts, with the context's tokens (progress). Throws kvlab::Error for an
// unknown method, bad parameters or budget, and a context too long.
MadeContext make_context(Engine & engine, const Tokenizer & tok, const ContextJob & job,
                         const std::function<void(const std::string & phase, int64_t n_tokens)> & on_phase = {});

}  // namespace kvlab
