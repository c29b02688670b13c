#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <thread>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab {

Budget Budget::from_ratio(double r) {
    if (!(r >= 0.0 && r < 1.0)) throw Error("press", "compression ratio must lie in [0, 1), got " + std::to_string(r));
    Budget b;
    b.ratio = r;
    return b;
}

Budget Budget::from_tokens(int64_t t) {
    if (t < 1) throw Error("press", "token budget must be at least 1, got " + std::to_string(t));
    Budget b;
    b.tokens = t;
    return b;
}

int64_t Budget::per_layer(int64_t L) const {
    if (tokens >= 0) return tokens;
    // kvpress's rule, in the same double arithmetic: n_kept = int(L * (1 - cr)), the kept
    // count rounded down (so a budget matches kvpress row for row)
    return int64_t(double(L) * (1.0 - ratio));
}

std::string Budget::describe() const {
    std::ostringstream o;
    if (tokens >= 0)
        o << "budget " << tokens << " tokens";
    else
        o << "ratio " << ratio;
    if (sliding) o << " (sliding-window layers too)";
    return o.str();
}

nlohmann::json CompressStats::to_json() const {
    return {{"plan_s", plan_s},
            {"observe_s", observe_s},
            {"apply_s", apply_s},
            {"seconds", seconds()},
            {"rows_before", rows_before},
            {"rows_after", rows_after},
            {"bytes_before", bytes_before},
            {"bytes_after", bytes_after},
            {"used_before", used_before},
            {"used_after", used_after},
            {"kept", kept}};
}

std::vector<int> compressed_layers(const KvStore & cache, const Budget & budget) {
    std::vector<int> layers;
    for (int il = 0; il < cache.n_layer(); ++il)
        if (budget.sliding || cache.window(il) == 0) layers.push_back(il);
    return layers;
}

namespace {

// On a sliding-window layer a compressed cache keeps what the layer's next query can see:
// every such row (the layer is not compressed) or those of them the method chose.
void restrict_sliding_layers(KeepPlan & plan, const KvStore & cache, const Budget & budget) {
    for (int il = 0; il < cache.n_layer(); ++il) {
        const int32_t w = cache.window(il);
        if (w == 0) continue;
        for (int h = 0; h < cache.n_head_kv(); ++h) {
            const std::vector<int32_t> & pos = cache.positions(il, h);
            const auto first = int32_t(std::upper_bound(pos.begin(), pos.end(), cache.next_pos() - w) - pos.begin());
            std::vector<int32_t> rows;
            if (budget.sliding) {
                for (int32_t r : plan[il][h])
                    if (r >= first) rows.push_back(r);
            } else {
                for (int32_t r = first; r < int32_t(pos.size()); ++r) rows.push_back(r);
            }
            plan[il][h] = std::move(rows);
        }
    }
}

}  // namespace

CompressStats compress(Press & press, KvStore & cache, const Budget & budget, int64_t reserve) {
    CompressStats st;
    st.observe_s = press.observe_seconds();
    st.rows_before = cache.total_rows();
    st.bytes_before = cache.bytes();
    st.used_before = cache.used_bytes();
    double t0 = now_seconds();
    KeepPlan plan = press.plan(cache, budget);
    if (int(plan.size()) == cache.n_layer()) restrict_sliding_layers(plan, cache, budget);
    st.plan_s = now_seconds() - t0;
    t0 = now_seconds();
    cache.compact(plan, reserve);
    st.apply_s = now_seconds() - t0;
    st.rows_after = cache.total_rows();
    st.bytes_after = cache.bytes();
    st.used_after = cache.used_bytes();
    st.kept = cache.rows_per_segment();
    return st;
}

namespace press {

namespace {
std::vector<Registration> & registry() {
    static std::vector<Registration> r;
    return r;
}
}  // namespace

void register_method(Registration r) {
    registry().push_back(std::move(r));
}

const Registration * find_method(const std::string & name) {
    for (const Registration & r : registry())
        if (r.info.name == name) return &r;
    return nullptr;
}

std::vector<const Registration *> all_methods() {
    std::vector<const Registration *> v;
    for (const Registration & r : registry()) v.push_back(&r);
    std::sort(v.begin(), v.end(), [](auto * a, auto * b) {
        return a->info.wrapper != b->info.wrapper ? !a->info.wrapper : a->info.name < b->info.name;
    });
    return v;
}

Params::Params(const std::string & method, const std::vector<ParamSpec> & specs, const ParamMap & given)
    : method_(method) {
    for (const ParamSpec & s : specs) values_[s.name] = s.def;
    for (const auto & [k, v] : given) {
        if (!values_.count(k)) {
            std::string known;
            for (const ParamSpec & s : specs) known += (known.empty() ? "" : ", ") + s.name;
            throw Error("press", "unknown parameter '" + k + "' for method " + method +
                                     (known.empty() ? " (it takes none)" : " (known: " + known + ")"));
        }
        values_[k] = v;
    }
}

const std::string & Params::raw(const std::string & name) const {
    auto it = values_.find(name);
    KVLAB_ASSERT(it != values_.end(), "parameter declared by the method");
    return it->second;
}

int64_t Params::get_int(const std::string & name) const {
    const std::string & v = raw(name);
    size_t used = 0;
    int64_t x = 0;
    try {
        x = std::stoll(v, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used == 0 || used != v.size())
        throw Error("press", method_ + ": parameter " + name + " must be an integer, got '" + v + "'");
    return x;
}

double Params::get_float(const std::string & name) const {
    const std::string & v = raw(name);
    size_t used = 0;
    double x = 0;
    try {
        x = std::stod(v, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used == 0 || used != v.size() || !std::isfinite(x))
        throw Error("press", method_ + ": parameter " + name + " must be a number, got '" + v + "'");
    return x;
}

bool Params::get_bool(const std::string & name) const {
    const std::string & v = raw(name);
    if (v == "true" || v == "1" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "no") return false;
    throw Error("press", method_ + ": parameter " + name + " must be true or false, got '" + v + "'");
}

std::string Params::get_string(const std::string & name) const {
    return raw(name);
}

nlohmann::json Params::json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto & [k, v] : values_) j[k] = v;
    return j;
}

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

std::vector<ParamSpec> window_params() {
    return {{"window", "32", "observation window w: the last w context tokens, always kept"},
            {"kernel", "7", "pooling kernel size (odd; 1 disables pooling)"},
            {"pooling", "max", "pooling of the scores along the keys: max, avg or none"}};
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

}  // namespace press

ObserverSet::ObserverSet(const Model & model) : per_row_(int64_t(model.hparams().n_head) * model.hparams().head_dim) {
    all_.first = std::numeric_limits<int64_t>::max();
    all_.on_queries = [this](int il, int64_t tok0, int64_t n, const float * q) {
        for (const QueryObserver * o : obs_)
            if (tok0 + n > o->first) {
                const int64_t skip = std::max<int64_t>(0, o->first - tok0);
                o->on_queries(il, tok0 + skip, n - skip, q + skip * per_row_);
            }
    };
}

void ObserverSet::add(const QueryObserver * o) {
    if (!o) return;
    obs_.push_back(o);
    all_.first = std::min(all_.first, o->first);
}

const QueryObserver * ObserverSet::get() const {
    return obs_.empty() ? nullptr : &all_;
}

std::unique_ptr<Press> make_press(const std::string & name, const ParamMap & params, const Model & model) {
    const press::Registration * r = press::find_method(name);
    if (!r) {
        std::string known;
        for (const press::Registration * m : press::all_methods()) known += (known.empty() ? "" : ", ") + m->info.name;
        throw Error("press", "unknown method '" + name + "' (methods: " + known + ")");
    }
    const std::vector<ParamSpec> specs =
        r->info.wrapper ? press::wrapper_specs(r->info.params, params) : r->info.params;
    press::Params p(name, specs, params);
    std::unique_ptr<Press> out = r->make(p, model);
    out->name_ = name;
    out->params_ = p.json();
    return out;
}

ParamMap apply_preset(const std::string & preset, const std::string & method, const ParamMap & params) {
    if (preset.empty()) return params;
    if (preset != "kvpress") throw Error("press", "unknown preset '" + preset + "' (presets: kvpress)");
    const press::Registration * r = press::find_method(method);
    if (!r) return params;  // make_press names the unknown method
    ParamMap out = r->info.kvpress_params;
    for (const auto & [k, v] : params) out[k] = v;
    return out;
}

std::vector<MethodInfo> press_methods() {
    std::vector<MethodInfo> v;
    for (const press::Registration * r : press::all_methods()) {
        MethodInfo info = r->info;
        if (info.wrapper) {  // a wrapper observes when its base does: report its default base
            const press::Registration * base = press::find_method(press::wrapper_base_param()[0].def);
            info.observes = base && base->info.observes;
        }
        v.push_back(std::move(info));
    }
    return v;
}

}  // namespace kvlab
