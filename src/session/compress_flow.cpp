#include "kvlab/compress_flow.h"

#include "kvlab/cache_file.h"
#include "kvlab/error.h"

namespace kvlab {

std::vector<int32_t> context_tokens(const Tokenizer & tok, const Model & model, const ContextJob & job) {
    std::vector<int32_t> tokens = tok.context_chat(job.before, job.text, {{"user", ""}}).context;
    const int64_t n_ctx = model.hparams().n_ctx_train;
    if (int64_t(tokens.size()) >= n_ctx)
        throw Error("context", "the context has " + std::to_string(tokens.size()) + " tokens; the model's context is " +
                                   std::to_string(n_ctx) + " (and questions need room after it)");
    return tokens;
}

MadeContext make_context(Engine & engine, const Tokenizer & tok, const ContextJob & job,
                         const std::function<void(const std::string & phase, int64_t n_tokens)> & on_phase) {
    const bool compressing = job.method != "none";
    if (!compressing && (job.budget || !job.params.empty()))
        throw Error("context", "a ratio, budget or parameters need a method (see `kvlab methods`)");
    std::vector<MethodRequest> methods;
    if (compressing) methods.push_back({job.method, job.params});
    // validates the method and its parameters before any work
    ContextSession session(engine, methods, SessionOptions{0, 0, &tok, job.cache_types});
    if (compressing && !job.budget)
        throw Error("context", "method " + job.method + " needs a ratio, a token budget or a byte budget");
    std::vector<int32_t> tokens = job.tokens.empty() ? context_tokens(tok, engine.model(), job) : job.tokens;
    if (on_phase) on_phase("prefill", int64_t(tokens.size()));
    session.prefill(tokens);
    const PrefillStats & ps = session.prefill_stats();
    if (on_phase && compressing) on_phase("compress", int64_t(tokens.size()));
    PreparedCache p = compressing ? session.compress(0, *job.budget) : session.full();
    const HParams & hp = engine.model().hparams();
    const int64_t n = int64_t(tokens.size()), rows_full = n * hp.n_layer * hp.n_head_kv;
    const KvStore & c = p.cache;
    nlohmann::json info = {
        {"method", p.method},
        {"params", compressing ? session.press(0).params() : nlohmann::json::object()},
        {"budget", compressing ? job.budget->to_json() : nlohmann::json()},
        {"preset", job.preset},
        {"before", before_json(job.before)},
        {"tokens", n},
        {"rows_kept", c.total_rows()},
        {"rows_full", rows_full},
        {"cache_type_k", cache_type_name(c.types().k)},
        {"cache_type_v", cache_type_name(c.types().v)},
        {"cache_type_low", c.types().mixed() ? nlohmann::json(cache_type_name(c.types().low)) : nlohmann::json()},
        {"rows_demoted", c.total_low_rows()},
        {"kv_bytes", c.used_bytes()},
        {"kv_bytes_full", uint64_t(rows_full) * c.row_bytes()},
        {"kv_bytes_full_f16", uint64_t(rows_full) * 2 * cache_row_bytes(GGML_TYPE_F16, hp.head_dim)},
        {"achieved_ratio", achieved_ratio(c, n)},
        {"timings",
         {{"prefill_s", ps.seconds},
          {"prefill_tokens_per_s", ps.tokens_per_second()},
          {"compress_s", p.stats.seconds()}}},
    };
    if (p.stats.budget_bytes >= 0) info["budget_bytes"] = p.stats.budget_bytes;
    return MadeContext{std::move(tokens), std::move(p), ps, std::move(info)};
}

}  // namespace kvlab
