// Python scorers (docs/python.md, "Python scorers"): kvlab.compress(cache, scorer, ...) where the
// scorer is a callable or an object with a `score` method (kvpress's ScorerPress shape), called
// per layer with the keys and values (and, when it asks, the prefill's observation-window
// queries). Its scores feed kvlab's own planning (press::Scores and the selection of
// press/policy.h) and compress(): the rows it drops are freed as any C++ method's.
#include <cmath>
#include <cstring>

#include "bindings.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"
#include "press/window_queries.h"

namespace kvlab::py {

namespace {

// What kvlab.compress reads from the scorer and its keyword arguments.
struct ScorerSpec {
    pb::object fn;  // fn(layer, keys, values[, queries]) -> scores [kv_heads, rows]
    std::string name, per = "uniform";
    int64_t n_sink = 0, window = 0, queries = 0;  // queries: window queries it wants (0: none)
    double alpha = 0.2;
};

std::string shape_of(const pb::array & a) {
    std::string s = "(";
    for (pb::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + (a.ndim() == 1 ? ",)" : ")");
}

// An integer attribute of the scorer (None or absent: `def`).
int64_t int_attr(const pb::object & o, const char * name, int64_t def) {
    if (!pb::hasattr(o, name) || o.attr(name).is_none()) return def;
    try {
        return o.attr(name).cast<int64_t>();
    } catch (const pb::cast_error &) {
        throw Error("python", std::string("the scorer's attribute '") + name + "' is not an integer");
    }
}

ScorerSpec spec_of(const pb::object & scorer, const pb::kwargs & options) {
    ScorerSpec sp;
    if (pb::isinstance<pb::type>(scorer))
        throw Error("python",
                    "the scorer is a class: pass an instance (" + scorer.attr("__name__").cast<std::string>() + "())");
    if (pb::hasattr(scorer, "score") && PyCallable_Check(scorer.attr("score").ptr()))
        sp.fn = scorer.attr("score");
    else if (PyCallable_Check(scorer.ptr()))
        sp.fn = scorer;
    else
        throw Error("python",
                    "method is neither a method's name nor a scorer (a callable, or an object with a score "
                    "method); got " +
                        pb::str(pb::type::handle_of(scorer).attr("__name__")).cast<std::string>());
    sp.name = pb::hasattr(scorer, "__name__")
                  ? pb::str(scorer.attr("__name__")).cast<std::string>()
                  : pb::str(pb::type::handle_of(scorer).attr("__name__")).cast<std::string>();
    // the rows always kept: the keyword arguments, else the scorer's attributes of the same name
    sp.n_sink = int_attr(scorer, "n_sink", 0);
    sp.window = int_attr(scorer, "window", 0);
    for (const auto & [k, v] : options) {
        const std::string key = k.cast<std::string>();
        try {
            if (v.is_none() && (key == "n_sink" || key == "window")) continue;  // None: the scorer's attribute
            if (key == "per")
                sp.per = v.cast<std::string>();
            else if (key == "n_sink")
                sp.n_sink = v.cast<int64_t>();
            else if (key == "window")
                sp.window = v.cast<int64_t>();
            else if (key == "alpha")
                sp.alpha = v.cast<double>();
            else
                throw Error("python",
                            "unknown parameter '" + key + "' for a Python scorer (per, n_sink, window, alpha)");
        } catch (const pb::cast_error &) {
            throw Error("python", "parameter '" + key +
                                      "' has the wrong type (per: a string, n_sink and window: "
                                      "integers, alpha: a number)");
        }
    }
    if (sp.per != "uniform" && sp.per != "layer" && sp.per != "global" && sp.per != "model")
        throw Error("python", "per must be uniform, layer, global or model, not '" + sp.per + "'");
    if (sp.n_sink < 0 || sp.window < 0) throw Error("python", "n_sink and window cannot be negative");
    if (!(sp.alpha >= 0.0 && sp.alpha <= 1.0)) throw Error("python", "alpha must lie in [0, 1]");
    // the observation-window queries: window_queries of them, or wants_queries (the window's)
    sp.queries = int_attr(scorer, "window_queries", 0);
    if (sp.queries < 0) throw Error("python", "the scorer's window_queries cannot be negative");
    if (sp.queries == 0 && pb::hasattr(scorer, "wants_queries") && pb::bool_(scorer.attr("wants_queries"))) {
        if (sp.window < 1) throw Error("python", "wants_queries needs window >= 1 (or set window_queries)");
        sp.queries = sp.window;
    }
    return sp;
}

// The scorer over the layers: reads each layer's rows (GIL released), then calls Python with them.
class PythonScorer {
public:
    PythonScorer(ScorerSpec sp, const HParams & hp) : sp_(std::move(sp)), hp_(hp) {}
    const ScorerSpec & spec() const { return sp_; }

    // The last `queries` context tokens' queries (press/window_queries.h, as SnapKV's scorer keeps them).
    const QueryObserver * observer(int64_t L, double * observe_s) {
        return sp_.queries == 0 ? nullptr : window_.observe(hp_, sp_.queries, L, observe_s);
    }

    // Called with the GIL released (inside compress()); takes it around each Python call only.
    press::Scores score(const KvStore & cache) {
        const int64_t L = cache.n_rows(0, 0);
        if (sp_.queries > 0 && !window_.complete(L))
            throw Error("python", sp_.name + ": the context's queries were not observed during its prefill");
        press::Scores s;
        s.L = L;
        s.n_sink = std::min(sp_.n_sink, L);
        s.window = std::min(sp_.window, L);
        s.per_layer = sp_.per == "layer";
        s.s.resize(size_t(cache.n_layer()));
        const int H = cache.n_head_kv(), d = cache.head_dim();
        for (int il = 0; il < cache.n_layer(); ++il) {
            // one copy per layer: F16 / quantized rows converted to float32, the heads side by side
            std::vector<float> k(size_t(H) * L * d), v(size_t(H) * L * d);
            for (int h = 0; h < H; ++h) {
                const std::vector<float> kh = press::keys(cache, il, h), vh = press::values(cache, il, h);
                std::copy(kh.begin(), kh.end(), k.begin() + size_t(h) * L * d);
                std::copy(vh.begin(), vh.end(), v.begin() + size_t(h) * L * d);
            }
            pb::gil_scoped_acquire gil;
            pb::object keys = to_numpy(std::move(k), {H, L, d}), values = to_numpy(std::move(v), {H, L, d});
            const pb::object r = sp_.queries > 0 ? sp_.fn(il, keys, values, queries(il)) : sp_.fn(il, keys, values);
            s.s[size_t(il)] = checked(r, il, H, s);
        }
        if (s.per_layer)  // one row set per layer: the heads' mean
            for (auto & layer : s.s) {
                std::vector<float> mean(static_cast<size_t>(L));
                for (int64_t j = 0; j < L; ++j) {
                    double sum = 0.0;
                    for (const auto & head : layer) sum += head[size_t(j)];
                    mean[size_t(j)] = float(sum / double(layer.size()));
                }
                for (auto & head : layer) head = mean;
            }
        return s;
    }

private:
    // [n_head, w, head_dim] of layer il (the observer keeps [w][n_head][head_dim]); GIL held.
    pb::object queries(int il) const {
        const int64_t nh = hp_.n_head, d = hp_.head_dim, w = window_.rows();
        std::vector<float> out(size_t(nh * w * d));
        for (int64_t r = 0; r < w; ++r)
            for (int64_t h = 0; h < nh; ++h)
                std::memcpy(out.data() + (h * w + r) * d, window_.layer(il) + (r * nh + h) * d,
                            size_t(d) * sizeof(float));
        return to_numpy(std::move(out), {nh, w, d});
    }

    // The scorer's answer for layer il as [head][row] floats: [kv_heads, rows], or [rows] for every
    // head; finite wherever it ranks (the forced rows' scores are ignored). GIL held.
    std::vector<std::vector<float>> checked(const pb::object & r, int il, int H, const press::Scores & s) const {
        const std::string where = sp_.name + " (layer " + std::to_string(il) + ")";
        using Floats = pb::array_t<float, pb::array::c_style | pb::array::forcecast>;
        Floats a;
        if (!r.is_none()) a = Floats::ensure(r);  // (None would become a 0-d NaN)
        if (r.is_none() || !a)
            throw Error("python", where + " returned " +
                                      pb::str(pb::type::handle_of(r).attr("__name__")).cast<std::string>() +
                                      ", not an array of scores [kv_heads, rows]");
        const bool shared = a.ndim() == 1 && a.shape(0) == s.L;
        if (!shared && !(a.ndim() == 2 && a.shape(0) == H && a.shape(1) == s.L))
            throw Error("python", where + " returned scores of shape " + shape_of(a) + "; expected (" +
                                      std::to_string(H) + ", " + std::to_string(s.L) + ") [kv_heads, rows]");
        std::vector<std::vector<float>> out(static_cast<size_t>(H));
        for (int h = 0; h < H; ++h) {
            const float * p = a.data() + (shared ? 0 : size_t(h) * s.L);
            out[size_t(h)].assign(p, p + s.L);
            for (int64_t j = 0; j < s.L; ++j)
                if (!s.is_forced(j) && !std::isfinite(p[j]))
                    throw Error("python", where + " returned a non-finite score (" + std::to_string(p[j]) +
                                              ") for head " + std::to_string(h) + ", row " + std::to_string(j));
        }
        return out;
    }

    ScorerSpec sp_;
    HParams hp_;
    press::WindowQueries window_;
};

// The selection of kvlab's policies (press/policy.h) for `per`.
press::Policy policy_for(const ScorerSpec & sp) {
    if (sp.per == "uniform" || sp.per == "layer") return press::uniform_policy();  // layer: s.per_layer
    if (sp.per == "model")  // one ranking over every compressed layer and head, as KVzip's
        return [](const press::Scores & s, const Budget & b, const KvStore & cache) {
            return press::select_global(s, b.per_layer(s.L), compressed_layers(cache, b));
        };
    // global: Ada-KV's allocation across each layer's heads, as press/methods/adakv.cpp's
    // (allocation=adakv); the test checks it keeps adakv's rows
    return [alpha = sp.alpha](const press::Scores & s, const Budget & b, const KvStore &) {
        const int64_t B = b.per_layer(s.L);
        press::check_budget(s, B);
        std::vector<std::vector<int64_t>> n(s.s.size());
        for (size_t il = 0; il < s.s.size(); ++il) {
            const int64_t bc = std::min(s.L - s.forced(), B - s.forced());
            std::vector<std::vector<float>> cs;
            for (size_t h = 0; h < s.s[il].size(); ++h) cs.push_back(press::candidate_scores(s, int(il), int(h)));
            n[il] = press::adakv_head_budgets(cs, bc, alpha);
        }
        return press::select_per_head(s, n);
    };
}

// A press around the Python scorer: the scores are asked once per compression (compress() plans
// twice for a byte budget that demotes).
class PythonPress : public Press {
public:
    PythonPress(ScorerSpec sp, const Model & m) : policy_(policy_for(sp)), scorer_(std::move(sp), m.hparams()) {
        const ScorerSpec & s = scorer_.spec();
        name_ = s.name;
        params_ = {{"per", s.per}, {"n_sink", s.n_sink}, {"window", s.window}, {"window_queries", s.queries}};
        if (s.per == "global") params_["alpha"] = s.alpha;
    }
    bool wants_queries() const { return scorer_.spec().queries > 0; }
    const QueryObserver * observer(KvStore &, int64_t L) override {
        observe_s_ = 0.0;
        return scorer_.observer(L, &observe_s_);
    }
    KeepPlan plan(const KvStore & cache, const Budget & budget) override {
        if (!cache.uniform())
            throw Error("python", name_ +
                                      ": the cache must hold the same rows in every layer and head (it is "
                                      "already compressed)");
        if (!scored_) scores_ = scorer_.score(cache), scored_ = true;
        return policy_(scores_, budget, cache);
    }

private:
    press::Policy policy_;
    PythonScorer scorer_;
    press::Scores scores_;
    bool scored_ = false;
};

}  // namespace

pb::object compress_with_scorer(PyCache & cache, const pb::object & scorer, const Budget & budget,
                                const pb::kwargs & options) {
    PyModel & pm = *cache.owner;
    // made and dropped with the GIL held: it holds the scorer's Python objects
    PythonPress press(spec_of(scorer, options), pm.model());
    if (press.wants_queries() && (!cache.pristine || cache.context.empty()))
        throw Error("python", press.name() +
                                  " wants the prefill's queries: compress a cache that holds only a plain prefill "
                                  "of its context (Model.prefill on a new cache)");
    const bool reprefill = press.wants_queries() || slid(cache);
    CompressStats st;
    {
        pb::gil_scoped_release nogil;
        ModelLock hold(pm);
        if (reprefill) {
            // the queries come from a prefill of the context with the scorer watching, as kvlab's
            // observing methods get them (session.cpp's ContextSession), the sliding-window layers'
            // rows held; the new cache replaces the old
            const int64_t L = int64_t(cache.context.size());
            KvStore fresh = pm.engine->new_cache(L, cache.store->types());
            fresh.hold_all_rows(true);  // sliding-window layers keep every row until compress()
            pm.engine->prefill(fresh, cache.context, nullptr, nullptr, press.observer(fresh, L));
            fresh.hold_all_rows(false);
            st = kvlab::compress(press, fresh, budget, 0);
            *cache.store = std::move(fresh);
        } else {
            // compress() plans (the scorer's calls) before it touches the store, and compacts into a
            // new buffer: a scorer's error leaves the cache as it was, without a copy
            st = kvlab::compress(press, *cache.store, budget, 0);
        }
    }
    cache.pristine = false;
    nlohmann::json j = st.to_json();
    j["method"] = press.name();
    j["params"] = press.params();
    j["budget"] = budget.to_json();
    j["reprefilled"] = reprefill;
    return json_to_python(j);
}

}  // namespace kvlab::py
