// The scored-method scaffold: a scorer plus a budget policy makes a press; the shared
// parameter specs (window methods, wrappers) and the rows a scorer reads.
#include <algorithm>
#include <atomic>
#include <thread>

#include "kvlab/error.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {

namespace {
class ScoredPress : public Press {
public:
    ScoredPress(std::unique_ptr<Scorer> s, Policy p) : scorer_(std::move(s)), policy_(std::move(p)) {}
    const QueryObserver * observer(KvStore & cache, int64_t L) override {
        observe_s_ = 0.0;
        return scorer_->observer(cache, L, &observe_s_);
    }
    KeepPlan plan(const KvStore & cache, const Budget & budget) override {
        if (!cache.uniform())
            throw Error("press", name_ + ": the cache must be a freshly prefilled context (it is already compressed)");
        last_ = scorer_->score(cache);
        return policy_(last_, budget, cache);
    }
    RowScores last_scores() const override {
        RowScores r{last_.s, std::vector<char>(size_t(last_.L), 0)};
        for (int64_t j = 0; j < last_.L; ++j) r.forced[size_t(j)] = last_.is_forced(j);
        return r;
    }

private:
    std::unique_ptr<Scorer> scorer_;
    Policy policy_;
    Scores last_;
};
}  // namespace

std::unique_ptr<Press> scored_press(std::unique_ptr<Scorer> scorer, Policy policy) {
    return std::make_unique<ScoredPress>(std::move(scorer), std::move(policy));
}

Policy uniform_policy() {
    return [](const Scores & s, const Budget & b, const KvStore &) {
        return select_per_layer_budget(s, std::vector<int64_t>(s.s.size(), b.per_layer(s.L)));
    };
}

Registration uniform_method(MethodInfo info, ScorerFactory scorer) {
    Registration r;
    r.info = std::move(info);
    r.scorer = scorer;
    r.make = [scorer](const Params & p, const Model & m) { return scored_press(scorer(p, m), uniform_policy()); };
    return r;
}

Scores score_segments(const KvStore & cache, int n_threads, const SegmentScore & f) {
    Scores s;
    s.L = cache.n_rows(0, 0);
    s.s.assign(size_t(cache.n_layer()), std::vector<std::vector<float>>(size_t(cache.n_head_kv())));
    parallel_for(int64_t(cache.n_layer()) * cache.n_head_kv(), n_threads, [&](int64_t u) {
        const int il = int(u / cache.n_head_kv()), h = int(u % cache.n_head_kv());
        s.s[size_t(il)][size_t(h)] = f(cache, il, h);
    });
    return s;
}

namespace {
class StatelessSegments : public SegmentScorer {
public:
    explicit StatelessSegments(SegmentScore f) : f_(std::move(f)) {}
    std::vector<float> score(const KvStore & cache, int il, int h) override { return f_(cache, il, h); }
    std::unique_ptr<SegmentScorer> another() const override { return std::make_unique<StatelessSegments>(f_); }

private:
    SegmentScore f_;
};
}  // namespace

std::unique_ptr<SegmentScorer> stateless_segment_scorer(SegmentScore f) {
    return std::make_unique<StatelessSegments>(std::move(f));
}

void refuse_decode_params(const std::string & method, const ParamMap & params) {
    if (!params.empty())
        throw Error("decode-policy",
                    method + " while decoding takes no --decode-param (got " + params.begin()->first + ")");
}

std::vector<ParamSpec> window_params() {
    return {{"window", "32", "observation window w: the last w context tokens, always kept"},
            {"kernel", "7", "pooling kernel size (odd; 1 disables pooling)"},
            {"pooling", "max", "pooling of the scores along the keys: max, avg or none", {"max", "avg", "none"}}};
}

ParamMap kvpress_window_params(const ParamMap & more) {
    ParamMap p = {{"window", "64"}, {"kernel", "5"}, {"pooling", "avg"}};
    p.insert(more.begin(), more.end());
    return p;
}

const std::vector<ParamSpec> & wrapper_base_param() {
    static const std::vector<ParamSpec> p = {
        {"base", "snapkv", "the scorer method wrapped (its parameters apply too)"}};
    return p;
}

std::vector<ParamSpec> wrapper_specs(const std::vector<ParamSpec> & own, const ParamMap & given) {
    std::vector<ParamSpec> specs = own;
    specs.insert(specs.end(), wrapper_base_param().begin(), wrapper_base_param().end());
    auto it = given.find("base");
    const std::string base = it == given.end() ? wrapper_base_param()[0].def : it->second;
    const Registration * r = find_method(base);
    if (!r || !r->scorer) {
        std::string ok;
        for (const Registration * m : all_methods())
            if (m->scorer) ok += (ok.empty() ? "" : ", ") + m->info.name;
        throw Error("press", "base '" + base + "' is not a scorer method (scorers: " + ok + ")");
    }
    for (const ParamSpec & s : r->info.params)
        if (std::none_of(specs.begin(), specs.end(), [&](const ParamSpec & x) { return x.name == s.name; }))
            specs.push_back(s);
    return specs;
}

std::unique_ptr<Scorer> make_base_scorer(const Params & p, const Model & m) {
    return find_method(p.get_string("base"))->scorer(p, m);
}

std::vector<float> keys(const KvStore & cache, int il, int h) {
    return cache.read_k(il, h);
}
std::vector<float> values(const KvStore & cache, int il, int h) {
    return cache.read_v(il, h);
}

void parallel_for(int64_t n, int n_threads, const std::function<void(int64_t)> & f) {
    const int nth = int(std::max<int64_t>(1, std::min<int64_t>(n, n_threads)));
    if (nth == 1) {
        for (int64_t i = 0; i < n; ++i) f(i);
        return;
    }
    // the calling thread and nth - 1 others take the next index until none is left: a
    // thread slowed by costlier indices (or by another process) takes fewer
    std::atomic<int64_t> next{0};
    std::vector<std::exception_ptr> errors(nth);
    auto work = [&](int t) {
        try {
            for (int64_t i = next++; i < n; i = next++) f(i);
        } catch (...) {
            errors[size_t(t)] = std::current_exception();
            next = n;  // the others stop at their next index
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nth; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto & th : pool) th.join();
    for (auto & e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace kvlab::press
