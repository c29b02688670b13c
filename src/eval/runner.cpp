// The per-sample loop of the evaluation: one context session per context (per question
// when query-aware) serves the full cache and every method × budget.
#include "eval/runner.h"

#include <algorithm>
#include <memory>

#include "eval/metrics.h"
#include "eval/plan.h"
#include "eval/record.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/registry.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"

namespace kvlab::eval {

namespace {

class Runner {
public:
    Runner(const RunConfig & cfg, Engine & engine, const Tokenizer & tok, const RunPlan & plan, std::ostream & os,
           const std::function<void(const Progress &)> & on_progress)
        : cfg_(cfg), engine_(engine), tok_(tok), plan_(plan), os_(os), on_progress_(on_progress) {
        for (const auto & m : cfg.methods) methods_.push_back({m.name, apply_preset(cfg.preset, m.name, m.params)});
        go_.max_tokens = cfg.max_tokens;
        go_.eog_ids = tok.eog_ids();
        if (cfg.decode.method != "none") policy_ = std::make_unique<DecodePolicy>(cfg.decode, engine.model());
        pr_.total = plan.n_answers();
        t_start_ = now_seconds();
    }

    void tick(const std::string & what) {
        pr_.elapsed_s = now_seconds() - t_start_;
        pr_.what = what;
        if (on_progress_) on_progress_(pr_);
    }

    void run_sample(const Sample & s) {
        const size_t nq = s.questions.size();
        std::vector<Tokenizer::SplitPrompt> prompts;
        for (const Question & q : s.questions) prompts.push_back(tok_.context_prompt(s.context, q.question));
        // wanted[c][qi]: not yet recorded
        std::vector<std::vector<bool>> wanted(plan_.configs.size(), std::vector<bool>(nq, false));
        int64_t n_todo = 0;
        for (size_t c = 0; c < plan_.configs.size(); ++c)
            for (size_t qi = 0; qi < nq; ++qi) {
                const EvalConfig & ec = plan_.configs[c];
                wanted[c][qi] = !plan_.done.count({s.id, int64_t(qi), ec.method, ec.label});
                if (wanted[c][qi]) {
                    ++n_todo;
                } else {
                    ++pr_.done;
                    ++pr_.skipped;
                }
            }
        if (n_todo == 0) return;
        if (cfg_.multi_turn) {  // one compression with the first question, every question from it
            std::vector<size_t> all(nq);
            for (size_t qi = 0; qi < nq; ++qi) all[qi] = qi;
            run_context(s, prompts, all, wanted);
        } else if (cfg_.query_aware) {
            for (size_t qi = 0; qi < nq; ++qi) run_context(s, prompts, {qi}, wanted);
        } else {
            std::vector<size_t> all(nq);
            for (size_t qi = 0; qi < nq; ++qi) all[qi] = qi;
            run_context(s, prompts, all, wanted);
        }
    }

private:
    // One prefill of the context (with the question when query-aware) answers `questions`
    // from the full cache (the baseline) and from every method × budget.
    void run_context(const Sample & s, const std::vector<Tokenizer::SplitPrompt> & prompts,
                     const std::vector<size_t> & questions, const std::vector<std::vector<bool>> & wanted) {
        std::vector<ContextQuery> cq(prompts.size());
        int64_t max_query = 0;
        for (size_t qi : questions) {
            cq[qi] = split_query(prompts[qi], cfg_.query_aware && !cfg_.multi_turn);
            max_query = std::max<int64_t>(max_query, int64_t(cq[qi].query.size()));
        }
        // multi-turn: the first question joins the context for compression, then is forgotten
        const int32_t n_context = int32_t(cq[questions[0]].context.size());
        const std::vector<int32_t> ctx =
            cfg_.multi_turn ? split_query(prompts[questions[0]], true).context : cq[questions[0]].context;
        const int64_t n_vocab = engine_.model().hparams().n_vocab;
        // a long-generation sample: every answer takes exactly its length
        GenerateOptions go = go_;
        if (s.answer_tokens > 0) {
            go.max_tokens = int32_t(s.answer_tokens);
            go.stop_on_eog = false;
        }
        std::vector<std::vector<int32_t>> full_answers(prompts.size());
        std::vector<std::vector<float>> full_logits(prompts.size());
        std::unique_ptr<ContextSession> owned;  // one prefill per entry of the cache-type axis
        for (size_t c = 0; c < plan_.configs.size(); ++c) {
            const EvalConfig & ec = plan_.configs[c];
            const bool reference = c == 0;  // the first full cache: every other answer is compared with it
            std::vector<size_t> qs;
            for (size_t qi : questions)
                if (reference || wanted[c][qi]) qs.push_back(qi);
            if (qs.empty()) continue;
            if (!owned || c == 0 || plan_.configs[c - 1].types != ec.types) {
                owned.reset();  // the previous entry's prefill is freed first
                // with a decoding policy a compressed cache grows by at most its interval (the full
                // cache grows as it generates)
                SessionOptions so{max_query, decode_growth(cfg_.decode, go.max_tokens), &tok_};
                const auto [k, v] = parse_types(ec.types);
                so.cache_types = CacheTypes{k, v, cfg_.kv_rotation};
                owned = std::make_unique<ContextSession>(engine_, methods_, so);
                tick(s.id + ": prefill " + std::to_string(ctx.size()) + " tokens (" + ec.types + ")");
                try {
                    owned->prefill(ctx);
                } catch (const Error & e) {
                    throw Error("eval", s.id + ": " + e.what());
                }
            }
            ContextSession & session = *owned;
            reset_peak_rss();
            // multi-turn: the budget counts context rows; the first question's rows come on top
            // (the method may keep them, they are dropped after): B(context) + |question|
            const auto budget = [&] {
                const Budget b = ec.budget.budget();
                return cfg_.multi_turn ? Budget::from_tokens(b.per_layer(n_context) + int64_t(ctx.size()) - n_context)
                                       : b;
            };
            PreparedCache p = ec.is_full() ? session.full() : session.compress(size_t(ec.method_index), budget());
            if (cfg_.multi_turn) p.cache.truncate(n_context, session.reserve());
            const DecodeHook * hook = ec.decoding ? &policy_->hook() : nullptr;
            for (size_t qi : qs) {
                const std::vector<int32_t> & query = cq[qi].query;
                GenerateOptions g = go;
                g.decode = hook;
                // with a decoding policy, fidelity is measured along token-by-token steps: the
                // reference's logits are those of its own generation (the same arithmetic)
                std::vector<float> steps;
                if (reference && policy_) g.step_logits = &steps;
                if (hook) policy_->start(p.cache);
                const GenerateResult r = session.answer(p.cache, query, g);
                nlohmann::json decode_stats;
                if (hook) decode_stats = policy_->stats().to_json();
                if (reference) {
                    full_answers[qi] = r.tokens;
                    full_logits[qi] = policy_ ? std::move(steps) : session.teacher_forced(p.cache, query, r.tokens);
                    // a stop at EOG stepped once more: row t predicts answer[t], max(1, |answer|) rows
                    if (policy_) full_logits[qi].resize(std::max<size_t>(1, r.tokens.size()) * size_t(n_vocab));
                }
                if (!wanted[c][qi]) continue;
                tick(s.id + " q" + std::to_string(qi) + ": " + ec.method + " " + ec.label);
                AnswerFacts f;
                f.sample = &s;
                f.question = qi;
                f.config = &ec;
                f.prepared = &p;
                f.method_params =
                    ec.is_full() ? nlohmann::json::object() : session.press(size_t(ec.method_index)).params();
                f.query_aware = cfg_.query_aware || cfg_.multi_turn;
                f.multi_turn = cfg_.multi_turn;
                f.context_tokens = cfg_.multi_turn ? n_context : session.context_tokens();
                f.prefill_s = session.prefill_stats().seconds;
                f.result = &r;
                f.text = tok_.decode(r.tokens);
                if (reference) {
                    f.fidelity.top1_agreement = 1.0;
                    f.fidelity.n_positions = int64_t(std::max<size_t>(1, r.tokens.size()));
                } else {
                    if (hook) policy_->start(p.cache);
                    f.fidelity = fidelity(full_logits[qi],
                                          session.teacher_forced(p.cache, query, full_answers[qi], hook), n_vocab);
                }
                f.decode_policy = decode_stats;
                f.identical = r.tokens == full_answers[qi];
                os_ << answer_record(f).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n"
                    << std::flush;
                ++pr_.done;
            }
        }
    }

    const RunConfig & cfg_;
    Engine & engine_;
    const Tokenizer & tok_;
    const RunPlan & plan_;
    std::ostream & os_;
    const std::function<void(const Progress &)> & on_progress_;
    std::vector<MethodRequest> methods_;
    GenerateOptions go_;
    std::unique_ptr<DecodePolicy> policy_;  // compression while decoding (cfg.decode), else null
    Progress pr_;
    double t_start_ = 0.0;
};

}  // namespace

std::string run(const RunConfig & cfg, const RunEnv & env, const std::function<void(const Progress &)> & on_progress) {
    const std::string path = env.resolve_model(cfg.model);
    // n_threads 0: follows the idle CPUs
    auto model = Model::load(path, {.n_threads = cfg.threads,
                                    .products = parse_products(cfg.products),
                                    .repack = cfg.repack,
                                    .hash_cache_dir = env.hash_cache_dir});
    Tokenizer tok(path);
    const RunPlan plan = plan_run(cfg, *model, tok, env.data_dir);
    std::ofstream os = open_records(plan, cfg, provenance(*model, tok));
    EngineOptions eo;
    eo.chunk_size = cfg.chunk;
    eo.attention = parse_attention_kernel(cfg.attention);
    eo.cache_types = {parse_cache_type(cfg.cache_type_k), parse_cache_type(cfg.cache_type_v), cfg.kv_rotation};
    Engine engine(*model, eo);
    Runner runner(cfg, engine, tok, plan, os, on_progress);
    runner.tick("starting");
    for (const Sample & s : plan.mine) runner.run_sample(s);
    runner.tick("done");
    return plan.out_path;
}

}  // namespace kvlab::eval
