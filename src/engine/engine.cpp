#include "kvlab/engine.h"

#include <cmath>
#include <cstring>

#include "engine/attention.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "model/arch.h"

namespace kvlab {

namespace {
constexpr size_t k_max_nodes = 8192;
}

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
    galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(model_.backend()));
    graph_meta_.resize(ggml_tensor_overhead() * k_max_nodes + ggml_graph_overhead_custom(k_max_nodes, false));
}

Engine::~Engine() {
    if (galloc_) ggml_gallocr_free(galloc_);
}

KvStore Engine::new_cache(int64_t capacity) const {
    return KvStore(model_.hparams(), model_.backend(), capacity);
}

uint64_t Engine::compute_bytes() const {
    return ggml_gallocr_get_buffer_size(galloc_, 0);
}

void Engine::eval(KvStore & cache, const int32_t * tokens, int64_t n, int64_t n_out, float * logits_out,
                  const QueryObserver * observer, int64_t tok0) {
    const HParams & hp = model_.hparams();
    cache.reserve(n);
    const int32_t pos0 = cache.next_pos();
    KVLAB_ASSERT(ggml_backend_buffer_is_host(cache.k(0)->buffer), "the KV store lives in host memory");

    // Rows already held per segment; the graph writes the n new rows right after them.
    std::vector<std::vector<int64_t>> n_past(hp.n_layer, std::vector<int64_t>(hp.n_head_kv));
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h) n_past[il][h] = cache.n_rows(il, h);
    // Positions are recorded now so that the kernels see them; undone if the graph fails.
    cache.commit(n);

    ggml_init_params params = {graph_meta_.size(), graph_meta_.data(), true};
    ggml_context * ctx = ggml_init(params);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, k_max_nodes, false);

    GraphInputs in;
    in.tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);  // I32 [n]
    in.pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);     // I32 [n]
    in.out_ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_out);
    for (ggml_tensor * t : {in.tokens, in.pos, in.out_ids}) ggml_set_input(t);

    std::vector<int32_t> pos(n), out_ids(n_out);
    for (int64_t i = 0; i < n; ++i) pos[i] = pos0 + int32_t(i);
    for (int64_t i = 0; i < n_out; ++i) out_ids[i] = int32_t(n - n_out + i);

    const bool use_ggml = opts_.attention == AttentionKernel::ggml;
    std::vector<std::pair<ggml_tensor *, std::vector<ggml_fp16_t>>> masks;  // per distinct layer position set
    std::vector<const std::vector<int32_t> *> mask_pos;
    std::vector<std::unique_ptr<attn::Problem>> problems;
    std::vector<ggml_tensor *> q_seen(hp.n_layer, nullptr);
    const bool observe = observer && observer->on_queries && tok0 + n > observer->first;

    const float scale = 1.0f / std::sqrt(float(hp.head_dim));
    const size_t row = size_t(hp.head_dim) * sizeof(ggml_fp16_t);
    AttentionFn attention = [&](int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v) {
        ggml_tensor * kc = cache.k(il);  // F16 [head_dim, rows]
        ggml_tensor * vc = cache.v(il);
        const bool block = cache.layer_uniform(il);
        std::vector<ggml_tensor *> writes;
        if (block) {
            // one [head_dim, n, n_head_kv] write into the [head_dim, cap, n_head_kv] block
            const size_t seg = size_t(cache.capacity(il, 0)) * row;
            const size_t at = size_t(n_past[il][0]) * row;
            ggml_tensor * kd = ggml_view_3d(ctx, kc, hp.head_dim, n, hp.n_head_kv, row, seg, at);
            ggml_tensor * vd = ggml_view_3d(ctx, vc, hp.head_dim, n, hp.n_head_kv, row, seg, at);
            writes.push_back(ggml_cpy(ctx, ggml_permute(ctx, k, 0, 2, 1, 3), kd));
            writes.push_back(ggml_cpy(ctx, ggml_permute(ctx, v, 0, 2, 1, 3), vd));
        } else {
            for (int h = 0; h < hp.n_head_kv; ++h) {
                const size_t at = size_t(cache.offset(il, h) + n_past[il][h]) * row;
                ggml_tensor * ks = ggml_view_2d(ctx, k, hp.head_dim, n, k->nb[2], h * k->nb[1]);
                ggml_tensor * vs = ggml_view_2d(ctx, v, hp.head_dim, n, v->nb[2], h * v->nb[1]);
                writes.push_back(ggml_cpy(ctx, ks, ggml_view_2d(ctx, kc, hp.head_dim, n, row, at)));
                writes.push_back(ggml_cpy(ctx, vs, ggml_view_2d(ctx, vc, hp.head_dim, n, row, at)));
            }
        }
        for (ggml_tensor * w : writes) ggml_build_forward_expand(gf, w);
        if (observe) {
            ggml_set_output(q);
            q_seen[il] = q;
        }

        if (block && use_ggml) {
            const std::vector<int32_t> & kpos = cache.positions(il, 0);
            const int64_t n_kv = int64_t(kpos.size());
            size_t mi = 0;
            while (mi < masks.size() && *mask_pos[mi] != kpos) ++mi;
            if (mi == masks.size()) {
                ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n);  // F16 [n_kv, n]
                ggml_set_input(mask);
                std::vector<ggml_fp16_t> m(size_t(n_kv) * n);
                const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t j = 0; j < n_kv; ++j) m[i * n_kv + j] = kpos[j] <= pos[i] ? zero : ninf;
                masks.emplace_back(mask, std::move(m));
                mask_pos.push_back(&kpos);
            }
            const size_t seg = size_t(cache.capacity(il, 0)) * row;
            ggml_tensor * ks = ggml_view_3d(ctx, kc, hp.head_dim, n_kv, hp.n_head_kv, row, seg, 0);
            ggml_tensor * vs = ggml_view_3d(ctx, vc, hp.head_dim, n_kv, hp.n_head_kv, row, seg, 0);
            ggml_tensor * qp = ggml_permute(ctx, q, 0, 2, 1, 3);  // [head_dim, n, n_head]
            ggml_tensor * o = ggml_flash_attn_ext(ctx, qp, ks, vs, masks[mi].first, scale, 0.0f, 0.0f);
            return ggml_reshape_2d(ctx, o, int64_t(hp.head_dim) * hp.n_head, n);  // o: [head_dim, n_head, n]
        }
        auto p = std::make_unique<attn::Problem>();
        p->n_q = int32_t(n);
        p->n_head = hp.n_head;
        p->n_head_kv = hp.n_head_kv;
        p->head_dim = hp.head_dim;
        p->scale = scale;
        p->q_pos = pos.data();
        for (int h = 0; h < hp.n_head_kv; ++h) {
            attn::Segment sg;
            sg.k =
                reinterpret_cast<const ggml_fp16_t *>(static_cast<const char *>(kc->data) + cache.offset(il, h) * row);
            sg.v =
                reinterpret_cast<const ggml_fp16_t *>(static_cast<const char *>(vc->data) + cache.offset(il, h) * row);
            sg.pos = cache.positions(il, h).data();
            sg.n = cache.n_rows(il, h);
            p->seg.push_back(sg);
        }
        ggml_tensor * o = attn::build(ctx, ggml_is_contiguous(q) ? q : ggml_cont(ctx, q), p.get(), writes);
        problems.push_back(std::move(p));
        return ggml_reshape_2d(ctx, o, int64_t(hp.head_dim) * hp.n_head, n);
    };
    ggml_tensor * logits = build_decoder(ctx, gf, model_, in, attention);
    ggml_set_output(logits);

    auto fail = [&](const std::string & msg) {
        ggml_free(ctx);
        cache.rollback(n);
        throw Error("engine", msg);
    };
    // ggml's allocator reuses its last plan for a graph of the same shape without looking at
    // output flags: a graph whose queries are outputs (observed) must get a fresh plan, or
    // their memory is shared with later nodes as in the unobserved graph before it.
    if (observe && !ggml_gallocr_reserve(galloc_, gf)) fail("could not reserve the compute buffer");
    if (!ggml_gallocr_alloc_graph(galloc_, gf)) fail("could not allocate the compute buffer");

    ggml_backend_tensor_set(in.tokens, tokens, 0, n * sizeof(int32_t));
    ggml_backend_tensor_set(in.pos, pos.data(), 0, n * sizeof(int32_t));
    ggml_backend_tensor_set(in.out_ids, out_ids.data(), 0, n_out * sizeof(int32_t));
    for (auto & [t, m] : masks) ggml_backend_tensor_set(t, m.data(), 0, m.size() * sizeof(ggml_fp16_t));

    const ggml_status st = ggml_backend_graph_compute(model_.backend(), gf);
    ggml_backend_synchronize(model_.backend());
    if (st != GGML_STATUS_SUCCESS) fail("graph computation failed");
    if (logits_out) ggml_backend_tensor_get(logits, logits_out, 0, ggml_nbytes(logits));
    if (observe) {
        const int64_t first = std::max<int64_t>(0, observer->first - tok0);
        const int64_t per_row = int64_t(hp.n_head) * hp.head_dim;
        std::vector<float> qrows(size_t((n - first) * per_row));
        for (int il = 0; il < hp.n_layer; ++il) {
            ggml_tensor * q = q_seen[il];  // F32 [head_dim, n_head, n], contiguous rope output
            KVLAB_ASSERT(q && ggml_is_contiguous(q), "observed queries are contiguous");
            ggml_backend_tensor_get(q, qrows.data(), first * q->nb[2], qrows.size() * sizeof(float));
            observer->on_queries(il, tok0 + first, n - first, qrows.data());
        }
    }
    ggml_free(ctx);
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
    cache.reserve(int64_t(tokens.size()));
    const double t0 = now_seconds();
    int64_t n_chunks = 0;
    for (size_t off = 0; off < tokens.size(); off += opts_.chunk_size) {
        const int64_t n = std::min<int64_t>(opts_.chunk_size, int64_t(tokens.size() - off));
        const bool is_last = off + n == tokens.size();
        float * out = all_logits ? all_logits->data() + off * n_vocab : (is_last ? last.data() : nullptr);
        eval(cache, tokens.data() + off, n, all_logits ? n : 1, out, observer, int64_t(off));
        ++n_chunks;
    }
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
                                const std::function<void(int32_t)> & on_token) {
    if (opts.max_tokens < 1) throw Error("engine", "max tokens must be at least 1");
    GenerateResult r;
    r.n_query = int64_t(query.size());
    std::mt19937_64 rng(opts.sampling.seed);
    const int64_t room = model_.hparams().n_ctx_train - cache.next_pos() - int64_t(query.size());
    const int32_t max_tokens = int32_t(std::min<int64_t>(opts.max_tokens, room));
    if (max_tokens < 1)
        throw Error("engine", "no room left in the model's context (" + std::to_string(model_.hparams().n_ctx_train) +
                                  " tokens) for an answer");
    cache.reserve(int64_t(query.size()) + max_tokens);

    const double t0 = now_seconds();
    std::vector<float> logits = prefill(cache, query);
    r.query_prefill_s = now_seconds() - t0;
    r.stop_reason = "max_tokens";
    double t_first = 0.0;
    std::vector<float> scratch;
    for (int32_t i = 0; i < max_tokens; ++i) {
        if (opts.n_logprobs > 0) scratch = logits;
        const int32_t tok = sample_token(logits, opts.sampling, rng);
        if (i == 0) {
            t_first = now_seconds();
            r.ttft_s = t_first - t0;
        }
        const bool eog = std::find(opts.eog_ids.begin(), opts.eog_ids.end(), tok) != opts.eog_ids.end();
        if (eog && opts.stop_on_eog) {
            r.stop_reason = "eog";
            break;
        }
        r.tokens.push_back(tok);
        if (opts.n_logprobs > 0) {
            log_softmax(scratch);
            TokenLogprob lp{tok, scratch[tok], {}};
            std::vector<int32_t> ids(scratch.size());
            for (size_t j = 0; j < ids.size(); ++j) ids[j] = int32_t(j);
            const size_t k = std::min<size_t>(opts.n_logprobs, ids.size());
            std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                              [&](int32_t a, int32_t b) { return scratch[a] > scratch[b]; });
            for (size_t j = 0; j < k; ++j) lp.top.emplace_back(ids[j], scratch[ids[j]]);
            r.logprobs.push_back(std::move(lp));
        }
        if (on_token) on_token(tok);
        if (i + 1 == max_tokens) break;
        logits.assign(model_.hparams().n_vocab, 0.0f);
        eval(cache, &tok, 1, 1, logits.data());
        ++r.n_decoded;
    }
    r.decode_s = now_seconds() - t_first;
    return r;
}

}  // namespace kvlab
