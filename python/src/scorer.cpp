// Python scorers (docs/python.md, "Python scorers"): kvlab.compress(cache, scorer, ...) where the
// scorer is a callable or an object with a `score` method (kvpress's ScorerPress shape), called
// per layer with the keys and values and, when it asks for them by its parameters' names, the
// prefill's observation-window queries and attention weights and the layer's hidden states.
// Its scores feed kvlab's own planning (press::Scores and the selection of press/policy.h) and
// compress(): the rows it drops are freed as any C++ method's.
#include <cmath>
#include <cstring>

#include "bindings.h"
#include "kvlab/sys.h"
#include "press/hidden_states.h"
#include "press/method.h"
#include "press/policy.h"
#include "press/window_attention.h"
#include "press/window_queries.h"

namespace kvlab::py {

namespace {

// What kvlab.compress reads from the scorer and its keyword arguments.
struct ScorerSpec {
    pb::object fn;  // fn(layer, keys, values, ...) -> scores [kv_heads, rows]
    std::string name, per = "uniform";
    int64_t n_sink = 0, window = 0;
    int64_t observed = 0;  // the observation window: the last `observed` context tokens' queries (0: none)
    // what it asks for by its parameters' names, passed as keyword arguments of those names
    bool queries = false, attentions = false, hidden_states = false;
    // kvlab's first form: window_queries or wants_queries, and none of those names: the queries
    // as the fourth positional argument
    bool positional_queries = false;
    double alpha = 0.2;
    bool observes() const { return observed > 0 || hidden_states; }
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

// The names of fn's parameters that can be given by keyword (not *args nor **kwargs); none when
// Python cannot tell (a builtin without a signature).
std::vector<std::string> keyword_parameters(const pb::object & fn) {
    std::vector<std::string> names;
    try {
        const pb::module_ inspect = pb::module_::import("inspect");
        const pb::object kinds = inspect.attr("Parameter");
        for (const pb::handle p : inspect.attr("signature")(fn).attr("parameters").attr("values")()) {
            const pb::object kind = p.attr("kind");
            if (kind.equal(kinds.attr("POSITIONAL_OR_KEYWORD")) || kind.equal(kinds.attr("KEYWORD_ONLY")))
                names.push_back(p.attr("name").cast<std::string>());
        }
    } catch (pb::error_already_set &) {  // ValueError / TypeError: no signature
        names.clear();
    }
    return names;
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
    // What it asks for: by its parameters' names (kvpress's score(module, hidden_states, keys,
    // values, attentions, kwargs)), else kvlab's first form (window_queries or wants_queries: the
    // queries as a fourth positional argument).
    for (const std::string & n : keyword_parameters(sp.fn)) {
        sp.queries = sp.queries || n == "queries";
        sp.attentions = sp.attentions || n == "attentions";
        sp.hidden_states = sp.hidden_states || n == "hidden_states";
    }
    const bool wants = pb::hasattr(scorer, "wants_queries") && pb::bool_(scorer.attr("wants_queries"));
    // the observation window: window_queries of the last tokens, else the window's
    sp.observed = int_attr(scorer, "window_queries", 0);
    if (sp.observed < 0) throw Error("python", "the scorer's window_queries cannot be negative");
    const bool named = sp.queries || sp.attentions || sp.hidden_states;
    sp.positional_queries = !named && (sp.observed > 0 || wants);
    if (sp.observed == 0 && (wants || sp.queries || sp.attentions)) {
        if (sp.window < 1)
            throw Error("python", sp.name + " asks for the window's " + (sp.attentions ? "attentions" : "queries") +
                                      ": set its window_queries (or window >= 1)");
        sp.observed = sp.window;
    }
    return sp;
}

// The scorer over the layers: reads each layer's rows (GIL released), then calls Python with them.
class PythonScorer {
public:
    PythonScorer(ScorerSpec sp, const Model & m) : sp_(std::move(sp)), model_(m), hp_(m.hparams()) {}
    const ScorerSpec & spec() const { return sp_; }

    // The prefill's observers it needs: the last `observed` context tokens' queries
    // (press/window_queries.h, as SnapKV's scorer keeps them), every token's hidden states.
    const QueryObserver * observer(int64_t L, double * observe_s) {
        observers_ = std::make_unique<ObserverSet>(model_);
        if (sp_.observed > 0) observers_->add(window_.observe(hp_, sp_.observed, L, observe_s));
        if (sp_.hidden_states) observers_->add(hidden_.observe(hp_, L, observe_s));
        return observers_->get();
    }

    // Called with the GIL released (inside compress()); takes it around each Python call only.
    press::Scores score(const KvStore & cache) {
        const int64_t L = cache.n_rows(0, 0);
        if ((sp_.observed > 0 && !window_.complete(L)) || (sp_.hidden_states && !hidden_.complete(L)))
            throw Error("python", sp_.name + ": the context's prefill was not observed");
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
            std::vector<float> attn, x;
            if (sp_.attentions) attn = attentions(cache, il, k);
            if (sp_.hidden_states) x = hidden_.take(il);
            pb::gil_scoped_acquire gil;
            pb::object keys = to_numpy(std::move(k), {H, L, d}), values = to_numpy(std::move(v), {H, L, d});
            pb::tuple args = sp_.positional_queries ? pb::make_tuple(il, keys, values, queries(il))
                                                    : pb::make_tuple(il, keys, values);
            pb::dict named;
            if (sp_.queries) named["queries"] = queries(il);
            if (sp_.attentions) named["attentions"] = to_numpy(std::move(attn), {hp_.n_head, window_.rows(), L});
            if (sp_.hidden_states) named["hidden_states"] = to_numpy(std::move(x), {L, hp_.n_embd});
            const pb::object r = sp_.fn(*args, **named);
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

    // Layer il's window attention [n_head][w][L] (press/window_attention.h) from the window's
    // queries and the keys k [kv_heads][L][head_dim]. The cache is a plain prefill: every head
    // holds the same rows.
    std::vector<float> attentions(const KvStore & cache, int il, const std::vector<float> & k) const {
        const std::vector<int32_t> & pos = cache.positions(il, 0);
        return press::window_attention_weights(hp_, il, window_.layer(il), window_.rows(), k.data(), pos.data(),
                                               int64_t(pos.size()), model_.n_threads());
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
    const Model & model_;
    HParams hp_;
    press::WindowQueries window_;
    press::HiddenStates hidden_;
    std::unique_ptr<ObserverSet> observers_;
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
    PythonPress(ScorerSpec sp, const Model & m) : policy_(policy_for(sp)), scorer_(std::move(sp), m) {
        const ScorerSpec & s = scorer_.spec();
        name_ = s.name;
        params_ = {{"per", s.per},
                   {"n_sink", s.n_sink},
                   {"window", s.window},
                   {"window_queries", s.observed},
                   {"attentions", s.attentions},
                   {"hidden_states", s.hidden_states}};
        if (s.per == "global") params_["alpha"] = s.alpha;
    }
    // Whether it scores from the prefill (queries, attentions or hidden states).
    bool observes() const { return scorer_.spec().observes(); }
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
    if (press.observes() && (!cache.pristine || cache.context.empty()))
        throw Error("python", press.name() +
                                  " scores from the prefill (its queries, attentions or hidden states): compress a "
                                  "cache that holds only a plain prefill of its context (Model.prefill on a new "
                                  "cache)");
    const bool reprefill = press.observes() || slid(cache);
    CompressStats st;
    {
        pb::gil_scoped_release nogil;
        ModelLock hold(pm);
        if (reprefill) {
            // what it observes (queries, hidden states) comes from a prefill of the context with the
            // scorer watching, as kvlab's observing methods get it (session.cpp's ContextSession), the
            // sliding-window layers' rows held; the new cache replaces the old
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
