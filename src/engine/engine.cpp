#include "kvlab/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "engine/commit_guard.h"
#include "engine/graph_frame.h"
#include "engine/store_attention.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/attention.h"
#include "kvlab/error.h"
#include "kvlab/op_profile.h"
#include "kvlab/sys.h"
#include "model/arch.h"

namespace kvlab {

namespace {

// Shapes kvlab's attention kernel cannot run are refused when the model meets the engine
// (the model layer cannot see the kernel), not by an assert during attention.
void check_kernel_limits(const Model & model) {
    const HParams & hp = model.hparams();
    if (hp.n_gqa() > kernels::attn::k_max_group)
        throw Error("engine", model.path() + ": GQA group n_head/n_head_kv = " + std::to_string(hp.n_head) + "/" +
                                  std::to_string(hp.n_head_kv) + " = " + std::to_string(hp.n_gqa()) +
                                  " exceeds kvlab's attention kernel limit " +
                                  std::to_string(kernels::attn::k_max_group));
}

}  // namespace

const char * attention_kernel_name(AttentionKernel k) {
    return k == AttentionKernel::ggml ? "ggml" : "kvlab";
}

AttentionKernel parse_attention_kernel(const std::string & name) {
    if (name == "kvlab") return AttentionKernel::kvlab;
    if (name == "ggml") return AttentionKernel::ggml;
    throw Error("engine", "unknown attention kernel '" + name + "' (expected kvlab or ggml)");
}

Engine::Engine(const Model & model, EngineOptions opts) : model_(model), opts_(opts) {
    if (opts_.chunk_size < 1) throw Error("engine", "chunk size must be at least 1");
    check_kernel_limits(model_);
    if (opts_.n_threads < 0) throw Error("engine", "threads cannot be negative");
    if (opts_.n_threads > 0) {  // its own CPU backend: engines on one model compute in parallel
        own_backend_.reset(ggml_backend_cpu_init());
        if (!own_backend_) throw Error("backend", "could not initialise a ggml CPU backend");
        ggml_backend_cpu_set_n_threads(own_backend_.get(), opts_.n_threads);
    }
    galloc_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(model_.backend())));
    if (!galloc_) throw Error("engine", "could not create the graph allocator");
    graph_meta_.resize(GraphFrame::meta_bytes());
}

KvStore Engine::new_cache(int64_t capacity) const {
    return new_cache(capacity, opts_.cache_types);
}

KvStore Engine::new_cache(int64_t capacity, CacheTypes types) const {
    return KvStore(model_.hparams(), model_.backend(), capacity, types);
}

// Huge pages for a newly allocated compute buffer, before its pages are touched: a prefill at
// depth streams megabytes of it per layer (attention's partial results and converted rows), which
// 4 KiB pages spread over more TLB entries than the CPU has.
void Engine::advise_compute_buffer(ggml_backend_buffer_t buf) {
    if (!buf || !ggml_backend_buffer_is_host(buf)) return;
    void * base = ggml_backend_buffer_get_base(buf);
    const size_t size = ggml_backend_buffer_get_size(buf);
    if (base == advised_.first && size == advised_.second) return;
    advise_huge_pages(base, size);
    advised_ = {base, size};
}

uint64_t Engine::compute_bytes() const {
    return ggml_gallocr_get_buffer_size(galloc_.get(), 0) +
           (scratch_buf_ ? ggml_backend_buffer_get_size(scratch_buf_.get()) : 0);
}

// The scratch of kvlab's nodes in a buffer of the engine's own, grown to the largest graph's
// need: the same lines graph after graph (each thread's slice stays in its caches, as the
// threads' own buffers did), apart from the intermediates' buffer. Placed in the compute
// buffer, where ggml's allocator puts it among the intermediates, decode attention at 4,096
// tokens ran 23% slower (smollm2-135m, 2 threads, AMD EPYC Zen 4).
void Engine::bind_scratch(const kernels::GraphScratch & scratch) {
    const size_t need = scratch.bytes();
    if (!scratch_buf_ || ggml_backend_buffer_get_size(scratch_buf_.get()) < need) {
        scratch_buf_.reset();
        scratch_buf_.reset(ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), need));
        if (!scratch_buf_) throw MemoryError("could not allocate " + std::to_string(need) + " bytes of kernel scratch");
    }
    if (ggml_backend_tensor_alloc(scratch_buf_.get(), scratch.tensor(),
                                  ggml_backend_buffer_get_base(scratch_buf_.get())) != GGML_STATUS_SUCCESS)
        throw Error("engine", "could not place the kernels' scratch");
}

void Engine::eval(KvStore & cache, const int32_t * tokens, int64_t n, int64_t n_out, float * logits_out,
                  const QueryObserver * observer, int64_t tok0) {
    const HParams & hp = model_.hparams();
    if (cache.lost_rows())
        throw Error("engine",
                    "the cache lost rows of its sliding-window layers in a failed evaluation; prefill it again");
    cache.reserve(n);
    KVLAB_ASSERT(ggml_backend_buffer_is_host(cache.k(0)->buffer), "the KV store lives in host memory");
    const int32_t pos0 = cache.next_pos();
    std::vector<std::vector<int64_t>> n_past = rows_held(cache);
    // Positions are recorded now so that the kernels see them; undone if anything below throws.
    cache.commit(n);
    CommitGuard guard(cache);
    guard.add(n);

    std::vector<int32_t> pos(n), out_ids(n_out);
    std::iota(pos.begin(), pos.end(), pos0);
    std::iota(out_ids.begin(), out_ids.end(), int32_t(n - n_out));

    const bool wanted = observer && tok0 + n > observer->first;
    const bool observe_q = wanted && observer->on_queries, observe_x = wanted && observer->on_hidden;
    const bool observe = observe_q || observe_x;
    const int n_threads = graph_threads();
    GraphFrame frame(graph_meta_, n, n_out, n_threads);
    StoreAttention store(frame.ctx.get(), frame.gf, hp, cache, std::move(n_past), pos, frame.scratch,
                         opts_.attention == AttentionKernel::ggml, observe_q, observe_x);
    ggml_tensor * logits = frame.build(model_, [&store](int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                                        ggml_tensor * x) { return store(il, q, k, v, x); });
    if (opts_.on_graph) opts_.on_graph(frame.gf);
    // ggml's allocator reuses its last plan for a graph of the same shape without looking at
    // output flags: a graph whose queries are outputs (observed, or marked by on_graph) must get
    // a fresh plan, or their memory is shared with later nodes as in the unobserved graph before it.
    compute(frame, logits, observe || opts_.on_graph, n_threads, n, [&] {
        frame.set_inputs(tokens, pos.data(), out_ids.data());
        store.set_inputs();
    });
    if (logits_out) ggml_backend_tensor_get(logits, logits_out, 0, ggml_nbytes(logits));
    if (observe) {
        const int64_t first = std::max<int64_t>(0, observer->first - tok0);
        const int64_t per_row = int64_t(hp.n_head) * hp.head_dim;
        std::vector<float> qrows(observe_q ? size_t((n - first) * per_row) : 0);
        std::vector<float> xrows(observe_x ? size_t((n - first) * hp.n_embd) : 0);
        // observers see q.k / sqrt(head_dim) as the logit (1 where the kernel scales by that)
        const float q_factor = hp.attn_scale > 0.0f ? hp.attn_scale * std::sqrt(float(hp.head_dim)) : 1.0f;
        for (int il = 0; il < hp.n_layer; ++il) {
            if (observe_x) {                         // before the layer's queries: an observer may weigh them by it
                ggml_tensor * x = store.hidden(il);  // F32 [n_embd, n]
                KVLAB_ASSERT(x && ggml_is_contiguous(x), "observed hidden states are contiguous");
                ggml_backend_tensor_get(x, xrows.data(), first * x->nb[1], xrows.size() * sizeof(float));
                observer->on_hidden(il, tok0 + first, n - first, xrows.data());
            }
            if (!observe_q) continue;
            ggml_tensor * q = store.queries(il);  // F32 [head_dim, n_head, n], contiguous rope output
            KVLAB_ASSERT(q && ggml_is_contiguous(q), "observed queries are contiguous");
            ggml_backend_tensor_get(q, qrows.data(), first * q->nb[2], qrows.size() * sizeof(float));
            if (q_factor != 1.0f)
                for (float & x : qrows) x *= q_factor;
            observer->on_queries(il, tok0 + first, n - first, qrows.data());
        }
    }
    guard.release();
    cache.slide();  // sliding-window layers free the rows no later query sees
}

int Engine::graph_threads() const {
    return own_backend_ ? opts_.n_threads : model_.refresh_threads();  // -t 0: the idle CPUs now
}

void Engine::compute(GraphFrame & frame, ggml_tensor * out, bool fresh_plan, int n_threads, int64_t n_tokens,
                     const std::function<void()> & set_inputs) {
    bind_scratch(frame.scratch);
    if (fresh_plan && !ggml_gallocr_reserve(galloc_.get(), frame.gf))
        throw Error("engine", "could not reserve the compute buffer");
    if (!ggml_gallocr_alloc_graph(galloc_.get(), frame.gf))
        throw Error("engine", "could not allocate the compute buffer");
    advise_compute_buffer(out->buffer);
    set_inputs();
    ggml_backend * be = own_backend_ ? own_backend_.get() : model_.backend();
    ggml_status st = GGML_STATUS_SUCCESS;
    const auto run = [&] {
        st = ggml_backend_graph_compute(be, frame.gf);
        ggml_backend_synchronize(be);
    };
    if (opts_.profile)
        opts_.profile->measure(frame.gf, n_threads, n_tokens, run);
    else
        run();
    if (st != GGML_STATUS_SUCCESS) throw Error("engine", "graph computation failed");
}

std::vector<float> Engine::prefill(KvStore & cache, const std::vector<int32_t> & tokens, PrefillStats * stats,
                                   std::vector<float> * all_logits, const QueryObserver * observer) {
    const HParams & hp = model_.hparams();
    if (tokens.empty()) throw Error("engine", "nothing to prefill: the token list is empty");
    const int64_t total = int64_t(cache.next_pos()) + int64_t(tokens.size());
    if (total > hp.n_ctx_train)
        throw Error("engine", "context of " + std::to_string(total) + " tokens exceeds the model's maximum of " +
                                  std::to_string(hp.n_ctx_train) + " (n_ctx_train)");
    for (int32_t t : tokens)
        if (t < 0 || t >= hp.n_vocab)
            throw Error("engine", "token id " + std::to_string(t) + " is outside the vocabulary");

    const int64_t n_vocab = hp.n_vocab;
    std::vector<float> last(n_vocab);
    if (all_logits) all_logits->assign(tokens.size() * size_t(n_vocab), 0.0f);
    cache.reserve(int64_t(tokens.size()), opts_.chunk_size);
    // A prefill is all or nothing: the chunks committed before one that throws are undone.
    CommitGuard guard(cache);
    const double t0 = now_seconds();
    int64_t n_chunks = 0;
    for (size_t off = 0; off < tokens.size(); off += opts_.chunk_size) {
        const int64_t n = std::min<int64_t>(opts_.chunk_size, int64_t(tokens.size() - off));
        const bool is_last = off + n == tokens.size();
        float * out = all_logits ? all_logits->data() + off * n_vocab : (is_last ? last.data() : nullptr);
        eval(cache, tokens.data() + off, n, all_logits ? n : 1, out, observer, int64_t(off));
        guard.add(n);
        ++n_chunks;
    }
    guard.release();
    if (all_logits)
        std::memcpy(last.data(), all_logits->data() + (tokens.size() - 1) * n_vocab, n_vocab * sizeof(float));
    if (stats) {
        stats->n_tokens = int64_t(tokens.size());
        stats->n_chunks = n_chunks;
        stats->seconds = now_seconds() - t0;
    }
    return last;
}

GenerateResult Engine::generate(KvStore & cache, const std::vector<int32_t> & query, const GenerateOptions & opts,
                                const std::function<bool(int32_t)> & on_token) {
    if (opts.max_tokens < 1) throw Error("engine", "max tokens must be at least 1");
    GenerateResult r;
    r.n_query = int64_t(query.size());
    std::mt19937_64 rng(opts.sampling.seed);
    const int64_t room = model_.hparams().n_ctx_train - cache.next_pos() - int64_t(query.size());
    int32_t max_tokens = int32_t(std::min<int64_t>(opts.max_tokens, room));
    if (opts.forced) {
        if (opts.forced->empty()) throw Error("engine", "teacher forcing needs at least one token");
        max_tokens = int32_t(std::min<int64_t>(max_tokens, int64_t(opts.forced->size())));
    }
    if (max_tokens < 1)
        throw Error("engine", "no room left in the model's context (" + std::to_string(model_.hparams().n_ctx_train) +
                                  " tokens) for an answer");
    const DecodeHook * hook = opts.decode;
    const int64_t growth = hook && hook->growth >= 0 ? std::min<int64_t>(hook->growth, max_tokens) : max_tokens;
    cache.reserve(int64_t(query.size()) + growth, opts_.chunk_size);

    const double t0 = now_seconds();
    std::vector<float> logits = prefill(cache, query);  // F32 [n_vocab], overwritten by each step
    r.query_prefill_s = now_seconds() - t0;
    r.kv_peak_bytes = cache.bytes();
    r.stop_reason = "max_tokens";
    double t_first = 0.0;
    std::vector<int32_t> ids;  // scratch of token_logprobs
    for (int32_t i = 0; i < max_tokens; ++i) {
        if (opts.step_logits) opts.step_logits->insert(opts.step_logits->end(), logits.begin(), logits.end());
        const int32_t tok = opts.forced ? (*opts.forced)[size_t(i)] : sample_token(logits, opts.sampling, rng);
        if (i == 0) {
            t_first = now_seconds();
            r.ttft_s = t_first - t0;
        }
        const bool eog = std::find(opts.eog_ids.begin(), opts.eog_ids.end(), tok) != opts.eog_ids.end();
        if (eog && opts.stop_on_eog && !opts.forced) {
            r.stop_reason = "eog";
            break;
        }
        r.tokens.push_back(tok);
        if (opts.n_logprobs > 0) r.logprobs.push_back(token_logprobs(logits, tok, opts.n_logprobs, ids));
        if (on_token && !on_token(tok)) {
            r.stop_reason = "caller";
            break;
        }
        if (i + 1 == max_tokens) break;
        eval(cache, &tok, 1, 1, logits.data(), hook ? hook->observer : nullptr);
        ++r.n_decoded;
        if (hook && hook->after_token) hook->after_token(cache);
        r.kv_peak_bytes = std::max(r.kv_peak_bytes, cache.bytes());
    }
    r.decode_s = now_seconds() - t_first;
    return r;
}

}  // namespace kvlab
