// kvlab.Cache and the Model methods that fill and read one (the seed's new_cache, prefill,
// next_logits, generate_from_cache, generate_text; S5-S9, S11): a cache is a real KvStore
// whose rows are freed when compressed; copy() is an independent deep copy.
#include "bindings.h"
#include "kvlab/batch_decoder.h"
#include "kvlab/cache_file.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::py {

namespace {

using ModelClass = pb::class_<PyModel, std::shared_ptr<PyModel>>;

PyCache & checked(PyCache & c, const PyModel & pm) {
    if (!c.store) throw Error("python", "this cache was given up (kvlab.compress failed on it)");
    if (c.owner.get() != &pm) throw Error("python", "this cache belongs to another model");
    return c;
}

// Feeds ids on top of the cache (the engine reserves as it needs); the cache's context grows
// while it is a plain prefill from position 0.
std::vector<float> feed(PyModel & pm, PyCache & c, const std::vector<int32_t> & ids, Engine & engine,
                        PrefillStats * ps) {
    if (ids.empty()) throw Error("python", "no token ids to feed");
    std::vector<float> logits;
    {
        pb::gil_scoped_release nogil;
        ModelLock hold(pm);
        logits = engine.prefill(*c.store, ids, ps);
    }
    if (c.pristine && c.store->next_pos() == int32_t(c.context.size() + ids.size()))
        c.context.insert(c.context.end(), ids.begin(), ids.end());
    else
        c.pristine = false;
    return logits;
}

pb::dict generation(const PyModel & pm, const GenerateResult & r) {
    pb::dict d;
    d["text"] = pm.tok().decode(r.tokens);
    d["output_ids"] = r.tokens;
    d["output_tokens"] = r.tokens.size();
    d["ttft_ms"] = r.ttft_s * 1e3;
    // kvlab's attention takes any per-layer and per-head lengths in one batch (the seed fed
    // such queries token by token)
    d["sequential_query_prefill"] = false;
    d["query_prefill_ms"] = r.query_prefill_s * 1e3;
    d["decode_ms"] = r.decode_s * 1e3;
    d["query_tokens"] = r.n_query;
    d["decode_tokens"] = r.n_decoded;
    d["stop_reason"] = r.stop_reason;
    d["kv_peak_bytes"] = r.kv_peak_bytes;
    return d;
}

pb::dict generate(PyModel & pm, PyCache & c, const std::vector<int64_t> & query, int max_tokens, float temp,
                  bool stop_on_eos, int top_k, float top_p, uint64_t seed) {
    checked(c, pm);
    GenerateOptions go;
    go.max_tokens = max_tokens;
    go.stop_on_eog = stop_on_eos;
    go.eog_ids = pm.tok().eog_ids();
    go.sampling = {temp, top_k, top_p, seed};
    if (max_tokens < 1) throw Error("python", "max_tokens must be at least 1");
    if (temp < 0 || top_k < 0 || !(top_p > 0 && top_p <= 1))
        throw Error("python", "temp >= 0, top_k >= 0, 0 < top_p <= 1");
    const std::vector<int32_t> ids = token_ids(pm, query, "generate_from_cache");
    if (ids.empty()) throw Error("python", "generate_from_cache needs at least one query token");
    GenerateResult r;
    {
        pb::gil_scoped_release nogil;
        ModelLock hold(pm);
        r = pm.engine->generate(*c.store, ids, go);
    }
    c.pristine = false;
    return generation(pm, r);
}

// Every (cache, query) pair decoded together, one graph per step (continuous batching).
pb::list generate_batch(PyModel & pm, const std::vector<std::shared_ptr<PyCache>> & caches,
                        const std::vector<std::vector<int64_t>> & queries, int max_tokens, float temp, bool stop_on_eos,
                        int top_k, float top_p, uint64_t seed, int64_t chunk) {
    if (caches.size() != queries.size())
        throw Error("python", "generate_batch takes one query per cache (" + std::to_string(caches.size()) +
                                  " caches, " + std::to_string(queries.size()) + " queries)");
    if (max_tokens < 1) throw Error("python", "max_tokens must be at least 1");
    if (temp < 0 || top_k < 0 || !(top_p > 0 && top_p <= 1))
        throw Error("python", "temp >= 0, top_k >= 0, 0 < top_p <= 1");
    GenerateOptions go;
    go.max_tokens = max_tokens;
    go.stop_on_eog = stop_on_eos;
    go.eog_ids = pm.tok().eog_ids();
    go.sampling = {temp, top_k, top_p, seed};
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < caches.size(); ++i) {
        if (!caches[i]) throw Error("python", "generate_batch: cache " + std::to_string(i) + " is None");
        checked(*caches[i], pm);
        for (size_t j = 0; j < i; ++j)
            if (caches[j] == caches[i]) throw Error("python", "generate_batch: a cache is in the batch twice");
        ids.push_back(token_ids(pm, queries[i], "generate_batch"));
        if (ids.back().empty()) throw Error("python", "generate_batch: query " + std::to_string(i) + " is empty");
    }
    std::vector<GenerateResult> results;
    {
        pb::gil_scoped_release nogil;
        ModelLock hold(pm);
        BatchDecoder dec(*pm.engine, chunk, int(std::max<size_t>(1, caches.size())));
        std::vector<int64_t> handles;
        for (size_t i = 0; i < caches.size(); ++i) handles.push_back(dec.add(*caches[i]->store, ids[i], go));
        dec.run();
        for (int64_t h : handles) results.push_back(dec.take(h));
    }
    pb::list out;
    for (size_t i = 0; i < caches.size(); ++i) {
        caches[i]->pristine = false;
        out.append(generation(pm, results[i]));
    }
    return out;
}

}  // namespace

void bind_cache(pb::module_ & m) {
    pb::class_<PyCache, std::shared_ptr<PyCache>>(m, "Cache", R"doc(A KV cache of one model (Model.new_cache()).

Its rows live in one ggml buffer; kvlab.compress frees the rows it drops. copy() is an independent
deep copy. lengths[layer][head] are the rows each (layer, KV head) holds, positions(layer, head)
their original positions.)doc")
        .def(
            "copy",
            [](const PyCache & c) {
                if (!c.store) throw Error("python", "this cache was given up");
                auto out = std::make_shared<PyCache>();
                out->owner = c.owner;
                out->store = std::make_unique<KvStore>(c.store->copy());
                out->context = c.context;
                out->pristine = c.pristine;
                return out;
            },
            "An independent deep copy (its own buffer).")
        .def_property_readonly(
            "nbytes", [](const PyCache & c) { return c.store ? c.store->bytes() : 0; },
            "Bytes of the cache's buffer as allocated (free room included).")
        .def_property_readonly(
            "used_bytes", [](const PyCache & c) { return c.store ? c.store->used_bytes() : 0; },
            "Bytes of the rows it holds.")
        .def_property_readonly("lengths", [](const PyCache & c) { return c.store->rows_per_segment(); })
        .def_property_readonly("next_pos", [](const PyCache & c) { return c.store->next_pos(); })
        .def_property_readonly("n_layers", [](const PyCache & c) { return c.store->n_layer(); })
        .def_property_readonly("n_kv_heads", [](const PyCache & c) { return c.store->n_head_kv(); })
        .def_property_readonly(
            "context", [](const PyCache & c) { return c.context; },
            "The tokens prefilled from position 0 while the cache was a plain prefill (what a method that "
            "observes the prefill re-reads in kvlab.compress).")
        .def(
            "positions",
            [](const PyCache & c, int layer, int head) {
                if (layer < 0 || layer >= c.store->n_layer() || head < 0 || head >= c.store->n_head_kv())
                    throw Error("python", "no (layer, head) (" + std::to_string(layer) + ", " + std::to_string(head) +
                                              ") in a cache of " + std::to_string(c.store->n_layer()) + " layers x " +
                                              std::to_string(c.store->n_head_kv()) + " KV heads");
                return pb::array_t<int32_t>(pb::cast(c.store->positions(layer, head)));
            },
            pb::arg("layer"), pb::arg("head"), "The original positions of the rows of (layer, KV head).");

    auto model = pb::reinterpret_borrow<ModelClass>(m.attr("Model"));
    model
        .def(
            "new_cache",
            [](const std::shared_ptr<PyModel> & pm) {
                auto c = std::make_shared<PyCache>();
                c->owner = pm;
                c->store = std::make_unique<KvStore>(pm->engine->new_cache(0));
                return c;
            },
            "An empty cache (it grows as tokens are fed).")
        .def(
            "load_cache",
            [](const std::shared_ptr<PyModel> & pm, const std::string & path) {
                auto c = std::make_shared<PyCache>();
                c->owner = pm;
                LoadedCacheFile f = [&] {
                    pb::gil_scoped_release nogil;
                    return load_cache_file(path, pm->model(), 0);
                }();
                c->store = std::make_unique<KvStore>(std::move(f.cache));
                c->context = f.content.tokens;
                c->pristine = f.content.context.value("method", "none") == "none";
                return c;
            },
            pb::arg("path"),
            "A cache file written by `kvlab compress` or `kvlab serve` (checked: checksums, this model file); its "
            "context tokens are Cache.context.")
        .def(
            "prefill",
            [](const std::shared_ptr<PyModel> & pm, const std::vector<int64_t> & ids, std::shared_ptr<PyCache> cache,
               pb::object step) {
                if (!cache) {
                    cache = std::make_shared<PyCache>();
                    cache->owner = pm;
                    cache->store = std::make_unique<KvStore>(pm->engine->new_cache(0));
                }
                checked(*cache, *pm);
                const std::vector<int32_t> toks = token_ids(*pm, ids, "prefill");
                // step: the chunk size (kvlab's computation is the same at every chunk size)
                std::unique_ptr<Engine> stepped;
                if (!step.is_none()) {
                    const int s = step.cast<int>();
                    if (s < 1) throw Error("python", "step must be at least 1");
                    EngineOptions eo = pm->engine->options();
                    eo.chunk_size = s;
                    stepped = std::make_unique<Engine>(pm->model(), eo);
                }
                PrefillStats ps;
                feed(*pm, *cache, toks, stepped ? *stepped : *pm->engine, &ps);
                return pb::make_tuple(
                    cache, pb::dict(pb::arg("prefill_ms") = ps.seconds * 1e3, pb::arg("prefill_tokens") = ps.n_tokens));
            },
            pb::arg("ids"), pb::arg("cache") = nullptr, pb::arg("step") = pb::none(),
            "Runs the model over ids into `cache` (a new one when None), in chunks of `step` tokens (the "
            "engine's chunk when None). Returns (cache, {prefill_ms, prefill_tokens}).")
        .def(
            "next_logits",
            [](const std::shared_ptr<PyModel> & pm, PyCache & cache, const std::vector<int64_t> & ids) {
                checked(cache, *pm);
                std::vector<float> logits = feed(*pm, cache, token_ids(*pm, ids, "next_logits"), *pm->engine, nullptr);
                const pb::ssize_t n = pb::ssize_t(logits.size());
                return to_numpy(std::move(logits), {n});
            },
            pb::arg("cache"), pb::arg("ids"),
            "Feeds ids on top of the cache (which keeps them) and returns the last position's logits, float32 "
            "[vocab_size] (no copy).")
        .def(
            "generate_from_cache",
            [](const std::shared_ptr<PyModel> & pm, PyCache & cache, const std::vector<int64_t> & query, int max_tokens,
               float temp, bool stop_on_eos, int top_k, float top_p, uint64_t seed) {
                return generate(*pm, cache, query, max_tokens, temp, stop_on_eos, top_k, top_p, seed);
            },
            pb::arg("cache"), pb::arg("query_ids"), pb::arg("max_tokens") = 64, pb::arg("temp") = 0.0f,
            pb::arg("stop_on_eos") = true, pb::arg("top_k") = 0, pb::arg("top_p") = 1.0f, pb::arg("seed") = 0,
            "Feeds the query on top of the cache (mutated, as the seed's), then samples up to max_tokens "
            "(greedy at temp 0). Returns the seed's keys: text, output_ids, output_tokens, ttft_ms, "
            "sequential_query_prefill, query_prefill_ms, decode_ms, query_tokens (and kvlab's decode_tokens, "
            "stop_reason, kv_peak_bytes).")
        .def(
            "generate_batch",
            [](const std::shared_ptr<PyModel> & pm, const std::vector<std::shared_ptr<PyCache>> & caches,
               const std::vector<std::vector<int64_t>> & queries, int max_tokens, float temp, bool stop_on_eos,
               int top_k, float top_p, uint64_t seed, int64_t chunk) {
                return generate_batch(*pm, caches, queries, max_tokens, temp, stop_on_eos, top_k, top_p, seed, chunk);
            },
            pb::arg("caches"), pb::arg("queries"), pb::arg("max_tokens") = 64, pb::arg("temp") = 0.0f,
            pb::arg("stop_on_eos") = true, pb::arg("top_k") = 0, pb::arg("top_p") = 1.0f, pb::arg("seed") = 0,
            pb::arg("chunk") = 64,
            "generate_from_cache for every (cache, query) pair at once: one graph per step for all of them "
            "(continuous batching; the weights read once per step), each query prefilled `chunk` tokens a step. "
            "Each result (a list, in order) is what generate_from_cache gives that pair alone (the same tokens; "
            "bit-identical under products amx / vnni). Caches of different row types take turns. Many questions "
            "of one context: pass copies of its cache.")
        .def(
            "generate_text",
            [](const std::shared_ptr<PyModel> & pm, const std::vector<int64_t> & ids, int max_tokens, float temp,
               bool stop_on_eos, int top_k, float top_p, uint64_t seed) {
                if (ids.empty()) throw Error("python", "generate_text needs at least one token");
                auto cache = std::make_shared<PyCache>();
                cache->owner = pm;
                cache->store = std::make_unique<KvStore>(pm->engine->new_cache(0));
                PrefillStats ps;
                const std::vector<int32_t> toks = token_ids(*pm, ids, "generate_text");
                if (toks.size() > 1) feed(*pm, *cache, {toks.begin(), toks.end() - 1}, *pm->engine, &ps);
                pb::dict d = generate(*pm, *cache, {ids.back()}, max_tokens, temp, stop_on_eos, top_k, top_p, seed);
                d["prefill_ms"] = ps.seconds * 1e3;
                d["prefill_tokens"] = ps.n_tokens;
                return d;
            },
            pb::arg("ids"), pb::arg("max_tokens") = 64, pb::arg("temp") = 0.0f, pb::arg("stop_on_eos") = true,
            pb::arg("top_k") = 0, pb::arg("top_p") = 1.0f, pb::arg("seed") = 0,
            "A fresh prefill of all but the last token, then generate_from_cache with the last one (the seed's "
            "TTFT boundary); the result has prefill_ms and prefill_tokens too.");
}

}  // namespace kvlab::py
