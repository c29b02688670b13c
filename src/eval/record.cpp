#include "eval/record.h"

#include "kvlab/sys.h"

namespace kvlab::eval {

nlohmann::json answer_record(const AnswerFacts & f) {
    const Sample & s = *f.sample;
    const Question & q = s.questions[f.question];
    const EvalConfig & c = *f.config;
    const KvStore & cache = f.prepared->cache;
    const GenerateResult & r = *f.result;
    const Budget & b = c.budget.b;
    nlohmann::json ratio = c.is_full()                     ? nlohmann::json(0.0)
                           : b.tokens >= 0 || b.by_bytes() ? nlohmann::json()
                                                           : nlohmann::json(b.ratio);
    // bytes against the context's full cache at F16 (the unit of the byte budgets)
    const double full_f16 =
        double(cache.full_rows(f.context_tokens)) * 2.0 * double(cache_row_bytes(GGML_TYPE_F16, cache.head_dim()));
    nlohmann::json budget_bytes_ratio = !c.is_full() && b.bytes_ratio > 0.0 ? nlohmann::json(b.bytes_ratio)
                                        : !c.is_full() && b.kv_bytes >= 0
                                            ? nlohmann::json(double(b.kv_bytes) / full_f16)
                                            : nlohmann::json();
    nlohmann::json compress;
    if (!c.is_full()) {
        compress = f.prepared->stats.to_json();
        compress.erase("kept");
    }
    return {{"kind", "answer"},
            {"sample_id", s.id},
            {"task", s.task},
            {"question_index", f.question},
            {"question", q.question},
            {"method", c.method},
            {"budget_label", c.label},
            {"ratio", ratio},
            {"achieved_ratio", achieved_ratio(cache, f.context_tokens)},
            {"params", f.method_params},
            {"query_aware", f.query_aware},
            {"multi_turn", f.multi_turn},
            {"metric", s.metric},
            // a long generation has no reference text: its score is its agreement with the full cache
            {"score", s.metric == "fidelity" ? f.fidelity.top1_agreement : score(s.metric, f.text, q.answers)},
            {"answer", f.text},
            {"answer_tokens", r.tokens.size()},
            {"references", q.answers},
            {"fidelity",
             {{"kl_mean", f.fidelity.kl_mean},
              {"kl_max", f.fidelity.kl_max},
              {"top1_agreement", f.fidelity.top1_agreement},
              {"n_positions", f.fidelity.n_positions},
              {"identical", f.identical}}},
            {"cache_type_k", cache_type_name(cache.types().k)},
            {"cache_type_v", cache_type_name(cache.types().v)},
            {"kv_rotation", cache.types().rotate},
            {"cache_type_low",
             cache.types().mixed() ? nlohmann::json(cache_type_name(cache.types().low)) : nlohmann::json()},
            {"cache_types", c.types},
            {"policy", c.policy},
            {"rows_demoted", cache.total_low_rows()},
            {"kv_bytes_full_f16", full_f16},
            {"kv_bytes_ratio", double(cache.used_bytes()) / full_f16},
            {"budget_bytes_ratio", budget_bytes_ratio},
            {"kv_allocated_bytes", cache.bytes()},
            {"kv_used_bytes", cache.used_bytes()},
            {"kv_peak_bytes", r.kv_peak_bytes},
            {"decode_policy", f.decode_policy},
            {"kept_rows", cache.total_rows()},
            {"context_tokens", f.context_tokens},
            {"prefill_s", f.prefill_s},
            {"compress_s", c.is_full() ? 0.0 : f.prepared->stats.seconds()},
            {"compress", compress},
            {"ttft_s", r.ttft_s},
            {"decode_s", r.decode_s},
            {"decode_tokens_per_s", r.decode_tokens_per_second()},
            {"stop_reason", r.stop_reason},
            {"peak_rss_bytes", mem_info().peak_rss_bytes},
            {"sample_meta", s.meta}};
}

}  // namespace kvlab::eval
