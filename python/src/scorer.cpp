// Python scorers (docs/python.md, "Python scorers"): kvlab.compress(cache, scorer, ...) where the
// scorer is a callable or an object with a `score` method (kvpress's ScorerPress shape), called
// per layer with the keys and values and, when it asks for them by its parameters' names, the
// prefill's observation-window queries and attention weights and the layer's hidden states.
// What it asks for is read here; the press around it is kvlab's callback press
// (include/kvlab/callback_press.h: the observers, kvlab's own selection, compress() frees the rows
// it drops as any method's).
#include "bindings.h"
#include "kvlab/callback_press.h"

namespace kvlab::py {

namespace {

// What kvlab.compress reads from the scorer and its keyword arguments: the callback press's spec,
// the function to call and how to call it.
struct ScorerSpec {
    CallbackScorer cb;  // its `score` is set by scorer_press
    pb::object fn;      // fn(layer, keys, values, ...) -> scores [kv_heads, rows]
    // kvlab's first form: window_queries or wants_queries, and none of the names queries,
    // attentions, hidden_states: the queries as the fourth positional argument
    bool positional_queries = false;
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
    CallbackScorer & cb = sp.cb;
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
    cb.name = pb::hasattr(scorer, "__name__")
                  ? pb::str(scorer.attr("__name__")).cast<std::string>()
                  : pb::str(pb::type::handle_of(scorer).attr("__name__")).cast<std::string>();
    // the rows always kept: the keyword arguments, else the scorer's attributes of the same name
    cb.n_sink = int_attr(scorer, "n_sink", 0);
    cb.window = int_attr(scorer, "window", 0);
    for (const auto & [k, v] : options) {
        const std::string key = k.cast<std::string>();
        try {
            if (v.is_none() && (key == "n_sink" || key == "window")) continue;  // None: the scorer's attribute
            if (key == "per")
                cb.per = v.cast<std::string>();
            else if (key == "n_sink")
                cb.n_sink = v.cast<int64_t>();
            else if (key == "window")
                cb.window = v.cast<int64_t>();
            else if (key == "alpha")
                cb.alpha = v.cast<double>();
            else
                throw Error("python",
                            "unknown parameter '" + key + "' for a Python scorer (per, n_sink, window, alpha)");
        } catch (const pb::cast_error &) {
            throw Error("python", "parameter '" + key +
                                      "' has the wrong type (per: a string, n_sink and window: "
                                      "integers, alpha: a number)");
        }
    }
    // What it asks for: by its parameters' names (kvpress's score(module, hidden_states, keys,
    // values, attentions, kwargs)), else kvlab's first form (window_queries or wants_queries: the
    // queries as a fourth positional argument).
    for (const std::string & n : keyword_parameters(sp.fn)) {
        cb.queries = cb.queries || n == "queries";
        cb.attentions = cb.attentions || n == "attentions";
        cb.hidden_states = cb.hidden_states || n == "hidden_states";
    }
    const bool wants = pb::hasattr(scorer, "wants_queries") && pb::bool_(scorer.attr("wants_queries"));
    // the observation window: window_queries of the last tokens, else the window's
    cb.observed = int_attr(scorer, "window_queries", 0);
    const bool named = cb.queries || cb.attentions || cb.hidden_states;
    sp.positional_queries = !named && (cb.observed > 0 || wants);
    cb.queries = cb.queries || sp.positional_queries || (!named && wants);  // the press then observes the window
    return sp;
}

// The scorer's answer as [kv_heads][L] floats: an array [kv_heads, rows], or [rows] for every
// head (the callback press checks the values). GIL held.
std::vector<std::vector<float>> as_scores(const pb::object & r, const std::string & where, int H, int64_t L) {
    using Floats = pb::array_t<float, pb::array::c_style | pb::array::forcecast>;
    Floats a;
    if (!r.is_none()) a = Floats::ensure(r);  // (None would become a 0-d NaN)
    if (r.is_none() || !a)
        throw Error("python", where + " returned " +
                                  pb::str(pb::type::handle_of(r).attr("__name__")).cast<std::string>() +
                                  ", not an array of scores [kv_heads, rows]");
    const bool shared = a.ndim() == 1 && a.shape(0) == L;
    if (!shared && !(a.ndim() == 2 && a.shape(0) == H && a.shape(1) == L))
        throw Error("python", where + " returned scores of shape " + shape_of(a) + "; expected (" + std::to_string(H) +
                                  ", " + std::to_string(L) + ") [kv_heads, rows]");
    std::vector<std::vector<float>> out(static_cast<size_t>(H));
    for (int h = 0; h < H; ++h) {
        const float * p = a.data() + (shared ? 0 : size_t(h) * L);
        out[size_t(h)].assign(p, p + L);
    }
    return out;
}

}  // namespace

std::unique_ptr<Press> scorer_press(const pb::object & scorer, const pb::kwargs & options, const Model & model) {
    ScorerSpec sp = spec_of(scorer, options);
    const int H = model.hparams().n_head_kv, d = model.hparams().head_dim, nh = model.hparams().n_head,
              n_embd = model.hparams().n_embd;
    // called with the GIL released (inside the compression): takes it for the call only; the rows
    // move into NumPy arrays without a copy
    sp.cb.score = [fn = sp.fn, positional = sp.positional_queries,
                   named_queries = sp.cb.queries && !sp.positional_queries, name = sp.cb.name, H, d, nh,
                   n_embd](LayerRows && rows) {
        pb::gil_scoped_acquire gil;
        const int64_t L = rows.rows, w = rows.window_rows;
        const pb::object keys = to_numpy(std::move(rows.keys), {H, L, d}),
                         values = to_numpy(std::move(rows.values), {H, L, d});
        pb::object queries;
        if (!rows.queries.empty()) queries = to_numpy(std::move(rows.queries), {nh, w, d});
        const pb::tuple args =
            positional ? pb::make_tuple(rows.layer, keys, values, queries) : pb::make_tuple(rows.layer, keys, values);
        pb::dict named;
        if (named_queries) named["queries"] = queries;
        if (!rows.attentions.empty()) named["attentions"] = to_numpy(std::move(rows.attentions), {nh, w, L});
        if (!rows.hidden.empty()) named["hidden_states"] = to_numpy(std::move(rows.hidden), {L, n_embd});
        const pb::object r = fn(*args, **named);
        return as_scores(r, name + " (layer " + std::to_string(rows.layer) + ")", H, L);
    };
    // the function holds Python objects: it is dropped with the press, with the GIL held
    return make_callback_press(std::move(sp.cb), model);
}

}  // namespace kvlab::py
