#include "kvlab/batch_decoder.h"

#include <algorithm>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

BatchDecoder::BatchDecoder(Engine & engine, int64_t chunk, int max_batch)
    : engine_(engine), chunk_(chunk), max_batch_(max_batch) {
    if (chunk < 1 || max_batch < 1) throw Error("engine", "a batch decoder needs a chunk and a batch of at least 1");
}

int64_t BatchDecoder::add(KvStore & cache, std::vector<int32_t> query, const GenerateOptions & opts,
                          std::function<bool(int32_t)> on_token) {
    if (query.empty()) throw Error("engine", "a request needs at least one query token");
    if (opts.max_tokens < 1) throw Error("engine", "max tokens must be at least 1");
    if (opts.decode || opts.forced)
        throw Error("engine", "a batched request takes no decoding policy or forced tokens");
    const int64_t n_ctx = engine_.model().hparams().n_ctx_train;
    const int64_t room = n_ctx - cache.next_pos() - int64_t(query.size());
    if (room < 1)
        throw Error("engine",
                    "no room left in the model's context (" + std::to_string(n_ctx) + " tokens) for an answer");
    Request q;
    q.cache = &cache;
    q.max_tokens = int32_t(std::min<int64_t>(opts.max_tokens, room));
    cache.reserve(int64_t(query.size()) + q.max_tokens, chunk_);  // as generate() does: the steps never regrow it
    q.query = std::move(query);
    q.opts = opts;
    q.on_token = std::move(on_token);
    q.rng.seed(opts.sampling.seed);
    q.logits.resize(size_t(engine_.model().hparams().n_vocab));
    q.t0 = now_seconds();
    q.r.n_query = int64_t(q.query.size());
    q.r.stop_reason = "max_tokens";
    q.r.kv_peak_bytes = cache.bytes();
    const int64_t id = next_id_++;
    requests_.emplace(id, std::move(q));
    return id;
}

void BatchDecoder::cancel(int64_t id) {
    auto it = requests_.find(id);
    if (it != requests_.end()) it->second.cancelled = true;
}

void BatchDecoder::finish(Request & q, const char * reason) {
    q.r.stop_reason = reason;
    if (q.t_first > 0.0) q.r.decode_s = now_seconds() - q.t_first;
    q.done = true;
}

void BatchDecoder::after_step(Request & q) {
    q.r.kv_peak_bytes = std::max(q.r.kv_peak_bytes, q.cache->bytes());
    if (q.prefilled < q.query.size()) return;  // the query is not through yet: nothing to sample
    const size_t i = q.r.tokens.size();
    if (i == 0 && q.t_first == 0.0) q.r.query_prefill_s = now_seconds() - q.t0;
    const int32_t tok = sample_token(q.logits, q.opts.sampling, q.rng);
    if (i == 0) {
        q.t_first = now_seconds();
        q.r.ttft_s = q.t_first - q.t0;
    }
    const bool eog = std::find(q.opts.eog_ids.begin(), q.opts.eog_ids.end(), tok) != q.opts.eog_ids.end();
    if (eog && q.opts.stop_on_eog) return finish(q, "eog");
    q.r.tokens.push_back(tok);
    if (q.opts.n_logprobs > 0) q.r.logprobs.push_back(token_logprobs(q.logits, tok, q.opts.n_logprobs, ids_));
    if (q.on_token && !q.on_token(tok)) return finish(q, "caller");
    if (int32_t(i) + 1 == q.max_tokens) return finish(q, "max_tokens");
    q.last = tok;
}

bool BatchDecoder::step() {
    // the requests that waited longest first (then the oldest); a step takes the caches of one
    // row-type set, that of the first
    std::vector<Request *> waiting;
    for (auto & [id, q] : requests_) {
        if (q.done) continue;
        if (q.cancelled) {
            finish(q, "caller");
            continue;
        }
        waiting.push_back(&q);
    }
    std::stable_sort(waiting.begin(), waiting.end(),
                     [](const Request * a, const Request * b) { return a->last_step < b->last_step; });
    std::vector<Request *> batch;
    std::vector<Engine::BatchItem> items;
    for (Request * r : waiting) {
        Request & q = *r;
        if (int(batch.size()) == max_batch_ || !(q.cache->types() == waiting[0]->cache->types())) continue;
        batch.push_back(&q);
        if (q.prefilled < q.query.size()) {
            const int64_t n = std::min<int64_t>(chunk_, int64_t(q.query.size() - q.prefilled));
            const bool last = q.prefilled + size_t(n) == q.query.size();
            items.push_back({q.cache, q.query.data() + q.prefilled, n, last ? q.logits.data() : nullptr});
        } else {
            items.push_back({q.cache, &q.last, 1, q.logits.data()});
        }
    }
    last_batch_ = int(batch.size());
    if (batch.empty()) return false;
    engine_.eval_batch(items);
    ++steps_;
    for (size_t i = 0; i < batch.size(); ++i) {
        Request & q = *batch[i];
        q.last_step = steps_;
        if (q.prefilled < q.query.size())
            q.prefilled += size_t(items[i].n);
        else
            ++q.r.n_decoded;
        after_step(q);
    }
    return true;
}

void BatchDecoder::run() {
    while (step()) {
    }
}

bool BatchDecoder::done(int64_t id) const {
    auto it = requests_.find(id);
    if (it == requests_.end()) throw Error("engine", "no request " + std::to_string(id) + " in the batch");
    return it->second.done;
}

GenerateResult BatchDecoder::take(int64_t id) {
    if (!done(id)) throw Error("engine", "request " + std::to_string(id) + " is not done");
    auto it = requests_.find(id);
    GenerateResult r = std::move(it->second.r);
    requests_.erase(it);
    return r;
}

int BatchDecoder::active() const {
    int n = 0;
    for (const auto & [id, q] : requests_) n += q.done ? 0 : 1;
    return n;
}

}  // namespace kvlab
