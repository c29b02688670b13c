// kvlab.compress(cache, method, ratio=... | budget=... | kv_bytes=... | bytes_ratio=..., **params):
// any registered method frees rows of a cache, as `kvlab compress` and `ask` do; kvlab.methods().
// A Python scorer in place of the method's name goes to compress_with_scorer (scorer.cpp).
#include "app/compress_in_place.h"
#include "bindings.h"
#include "kvlab/error.h"

namespace kvlab::py {

namespace {

// Exactly one budget; demote (a cache type) keeps the rows the budget would evict at that type.
Budget budget_of(const pb::object & ratio, const pb::object & budget, const pb::object & kv_bytes,
                 const pb::object & bytes_ratio, const pb::object & demote) {
    const int given = !ratio.is_none() + !budget.is_none() + !kv_bytes.is_none() + !bytes_ratio.is_none();
    if (given != 1) throw Error("python", "give exactly one of ratio, budget, kv_bytes and bytes_ratio");
    Budget b = !ratio.is_none()      ? Budget::from_ratio(ratio.cast<double>())
               : !budget.is_none()   ? Budget::from_tokens(budget.cast<int64_t>())
               : !kv_bytes.is_none() ? Budget::from_bytes(kv_bytes.cast<int64_t>())
                                     : Budget::from_bytes_ratio(bytes_ratio.cast<double>());
    if (!demote.is_none()) b.set_demotion(parse_cache_type(demote.cast<std::string>()), -1.0);
    return b;
}

ParamMap param_map(const pb::kwargs & params) {
    ParamMap out;
    for (const auto & [k, v] : params) {
        const std::string key = k.cast<std::string>();
        // Python's True/False as kvlab's true/false; numbers and strings as their text
        out[key] = pb::isinstance<pb::bool_>(v) ? (v.cast<bool>() ? "true" : "false") : pb::str(v).cast<std::string>();
    }
    return out;
}

}  // namespace

void bind_compress(pb::module_ & m) {
    m.def(
        "compress",
        [](PyCache & cache, const pb::object & how, pb::object ratio, pb::object budget, pb::object kv_bytes,
           pb::object bytes_ratio, pb::object demote, const std::string & preset, bool compress_sliding,
           const pb::kwargs & params) {
            if (!cache.store) throw Error("python", "this cache was given up");
            PyModel & pm = *cache.owner;
            Budget b = budget_of(ratio, budget, kv_bytes, bytes_ratio, demote);
            b.sliding = compress_sliding;  // the CLI's --compress-sliding
            // a registered method by name, or a Python scorer's press (made and dropped with the GIL held)
            std::unique_ptr<Press> press;
            if (pb::isinstance<pb::str>(how)) {
                const std::string method = how.cast<std::string>();
                press = make_press(method, apply_preset(preset, method, param_map(params)), pm.model());
            } else {
                if (!preset.empty()) throw Error("python", "preset applies to kvlab's methods, not to a Python scorer");
                press = scorer_press(how, params, pm.model());
            }
            // A method that scores from the prefill (its queries, hidden states or passes of its own)
            // scores from a prefill of the cache's context made with it watching, as the CLI's.
            if (press->observes() && (!cache.pristine || cache.context.empty()))
                throw Error("python", press->name() +
                                          " scores from the prefill: compress a cache that holds only a plain "
                                          "prefill of its context (Model.prefill on a new cache)");
            app::InPlace done;
            {
                pb::gil_scoped_release nogil;
                ModelLock hold(pm);
                const std::vector<int32_t> none;
                done = app::compress_in_place(*pm.engine, &pm.tok(), *cache.store,
                                              cache.pristine ? cache.context : none, *press, b);
            }
            cache.pristine = false;
            nlohmann::json j = done.stats.to_json();
            j["method"] = press->name();
            j["params"] = press->params();
            j["budget"] = b.to_json();
            j["reprefilled"] = done.reprefilled;
            return json_to_python(j);
        },
        pb::arg("cache"), pb::arg("method"), pb::arg("ratio") = pb::none(), pb::arg("budget") = pb::none(),
        pb::arg("kv_bytes") = pb::none(), pb::arg("bytes_ratio") = pb::none(), pb::arg("demote") = pb::none(),
        pb::arg("preset") = "", pb::arg("compress_sliding") = false,
        R"doc(Compresses the cache in place with a registered method (kvlab.methods()) or a Python scorer, freeing
the rows it drops.

Exactly one budget: ratio (share of rows removed), budget (rows kept per layer), kv_bytes, or bytes_ratio
(share of the full cache's F16 bytes); demote="q4_0" keeps the rows it would evict at that type. Method
parameters as keyword arguments (window=8); preset="kvpress" follows kvpress's rules. On a model with
sliding-window layers (Gemma 3) the method compresses the global layers and each sliding layer keeps its
window; compress_sliding=True (the CLI's --compress-sliding) applies it inside their window too. A method that
scores from the prefill (SnapKV, KVzip, KVzap, ...) re-reads the cache's context with it watching: give it
a cache that holds a plain prefill. Returns the compression's figures (rows and bytes before and after,
kept rows per layer and head, times).

method may instead be a Python scorer: a callable, or an object with a score method, called per layer as
score(layer, keys, values) and returning scores [kv_heads, rows] (higher is kept first); parameters named
queries, attentions or hidden_states get the prefill's window queries [n_heads, window, head_dim], window
attention weights [n_heads, window, rows] and the layer's hidden states [rows, hidden_size]; then the
keyword arguments are per="uniform"|"layer"|"global"|"model", n_sink, window and alpha (docs/python.md,
"Python scorers").)doc");
    m.def(
        "methods",
        [] {
            nlohmann::json out = nlohmann::json::array();
            for (const MethodInfo & i : press_methods()) out.push_back(i.to_json());
            return json_to_python(out);
        },
        "Every registered method with its parameters and defaults.");
}

}  // namespace kvlab::py
