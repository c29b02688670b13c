#include "kvlab/session.h"

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

int64_t answer_reserve(const SessionOptions & o) {
    return o.max_query_tokens + o.max_answer_tokens;
}

ContextQuery split_query(const Tokenizer::SplitPrompt & p, bool query_aware) {
    if (!query_aware || p.query.empty()) return {p.context, p.query};
    ContextQuery cq{p.context, {p.query.back()}};
    cq.context.insert(cq.context.end(), p.query.begin(), p.query.end() - 1);
    return cq;
}

double achieved_ratio(const KvStore & c, int64_t context_rows) {
    const double full = double(c.full_rows(context_rows));  // sliding layers: their window
    return full > 0 ? 1.0 - double(c.total_rows()) / full : 0.0;
}

ContextSession::ContextSession(Engine & engine, const std::vector<MethodRequest> & methods, SessionOptions opts)
    : engine_(engine), opts_(opts), reserve_(answer_reserve(opts)) {
    if (opts.max_query_tokens < 0 || opts.max_answer_tokens < 0)
        throw Error("session", "query and answer lengths cannot be negative");
    for (const MethodRequest & m : methods) {
        owned_.push_back(make_press(m.name, m.params, engine.model()));
        presses_.push_back(owned_.back().get());
    }
    check_presses();
}

ContextSession::ContextSession(Engine & engine, Press & press, SessionOptions opts)
    : engine_(engine), opts_(opts), reserve_(answer_reserve(opts)), presses_{&press} {
    if (opts.max_query_tokens < 0 || opts.max_answer_tokens < 0)
        throw Error("session", "query and answer lengths cannot be negative");
    check_presses();
}

void ContextSession::check_presses() const {
    for (const Press * p : presses_)
        if (p->has_scoring_passes() && !opts_.tok)
            throw Error("session", p->name() + " runs prompts of its own: the session needs the model's tokenizer");
}

void ContextSession::prefill(const std::vector<int32_t> & context) {
    if (base_ || prefill_.n_tokens > 0) throw Error("session", "a session prefills one context");
    const int64_t L = int64_t(context.size()), n_ctx = engine_.model().hparams().n_ctx_train;
    if (L < 1) throw Error("session", "the context is empty");
    if (L + reserve_ > n_ctx)
        throw Error("session", "the context has " + std::to_string(L) + " tokens; with the longest query (" +
                                   std::to_string(opts_.max_query_tokens) + ") and answer (" +
                                   std::to_string(opts_.max_answer_tokens) + ") that exceeds the model's context of " +
                                   std::to_string(n_ctx) + " tokens");
    auto base =
        std::make_unique<KvStore>(opts_.cache_types ? engine_.new_cache(L, *opts_.cache_types) : engine_.new_cache(L));
    // The methods score every layer's rows: sliding-window layers keep their whole context
    // until compress() (full() and compress() free what the windows no longer see).
    base->hold_all_rows(!presses_.empty());
    ObserverSet observers(engine_.model());
    for (Press * p : presses_) observers.add(p->observer(*base, L));
    PrefillStats ps;
    engine_.prefill(*base, context, &ps, nullptr, observers.get());
    for (const Press * p : presses_) ps.seconds -= p->observe_seconds();  // the model's part
    // The methods' own passes (KVzip's repeat prompts), each rolled back at once: the store
    // holds exactly the context again after each. Their time is the method's.
    bool passes_ran = false;
    for (Press * p : presses_) {
        if (!p->has_scoring_passes()) continue;
        passes_ran = true;
        const double t0 = now_seconds();
        for (const ScoringPass & pass : p->scoring_passes(*base, context, *opts_.tok)) {
            if (L + int64_t(pass.tokens.size()) > n_ctx)
                throw Error("session", p->name() + "'s scoring pass needs " + std::to_string(pass.tokens.size()) +
                                           " tokens after the context; the model's context is " +
                                           std::to_string(n_ctx) + " tokens");
            engine_.prefill(*base, pass.tokens, nullptr, nullptr, pass.observer);
            base->rollback(int64_t(pass.tokens.size()));
        }
        p->add_scoring_seconds(now_seconds() - t0);
    }
    if (passes_ran) base->fit(0);  // the passes grew the store: back to exactly the context's rows
    prefill_ = ps;
    base_ = std::move(base);
}

const KvStore & ContextSession::prefilled() const {
    if (!base_) throw Error("session", "no context has been prefilled");
    return *base_;
}

PreparedCache ContextSession::full() const {
    PreparedCache p{prefilled().copy(), {}, "none"};
    CompressStats & st = p.stats;
    st.rows_before = p.cache.total_rows();
    st.bytes_before = p.cache.bytes();
    st.used_before = p.cache.used_bytes();
    p.cache.fit(reserve_);
    st.rows_after = p.cache.total_rows();
    st.bytes_after = p.cache.bytes();
    st.used_after = p.cache.used_bytes();
    st.kept = p.cache.rows_per_segment();
    return p;
}

PreparedCache ContextSession::compress(size_t method, const Budget & budget) {
    Press & press = *presses_.at(method);
    PreparedCache p{prefilled().copy(), {}, press.name()};
    p.stats = kvlab::compress(press, p.cache, budget, reserve_);
    return p;
}

PreparedCache ContextSession::compress_prefilled(size_t method, const Budget & budget) {
    Press & press = *presses_.at(method);
    prefilled();  // throws before any prefill
    PreparedCache p{std::move(*base_), {}, press.name()};
    base_.reset();
    p.stats = kvlab::compress(press, p.cache, budget, reserve_);
    return p;
}

GenerateResult ContextSession::answer(const KvStore & cache, const std::vector<int32_t> & query,
                                      const GenerateOptions & go) const {
    KvStore work = cache.copy();
    return engine_.generate(work, query, go);
}

std::vector<float> ContextSession::teacher_forced(const KvStore & cache, const std::vector<int32_t> & query,
                                                  const std::vector<int32_t> & answer, const DecodeHook * hook) const {
    if (query.empty()) throw Error("session", "teacher forcing needs a query");
    KvStore work = cache.copy();
    if (hook && !answer.empty()) {
        GenerateOptions go;
        go.max_tokens = int32_t(answer.size());
        go.forced = &answer;
        go.decode = hook;
        std::vector<float> logits;
        go.step_logits = &logits;
        engine_.generate(work, query, go);
        return logits;
    }
    std::vector<int32_t> seq = query;
    if (!answer.empty()) seq.insert(seq.end(), answer.begin(), answer.end() - 1);
    std::vector<float> all;
    engine_.prefill(work, seq, nullptr, &all);
    const int64_t n_vocab = engine_.model().hparams().n_vocab;
    const int64_t rows = std::max<int64_t>(1, int64_t(answer.size()));
    const int64_t first = int64_t(query.size()) - 1;
    return {all.begin() + first * n_vocab, all.begin() + (first + rows) * n_vocab};
}

}  // namespace kvlab
