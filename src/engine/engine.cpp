#include "kvlab/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

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

constexpr size_t k_max_nodes = 8192;

// Undoes the rows committed to a cache unless released: whatever throws after a commit
// (graph building, allocation, computation, an observer), the cache is left as it was.
class CommitGuard {
public:
    explicit CommitGuard(KvStore & cache) : cache_(cache) {}
    ~CommitGuard() {
        if (n_ > 0) cache_.rollback(n_);
    }
    CommitGuard(const CommitGuard &) = delete;
    CommitGuard & operator=(const CommitGuard &) = delete;
    void add(int64_t n) { n_ += n; }
    void release() { n_ = 0; }

private:
    KvStore & cache_;
    int64_t n_ = 0;
};

// One layer's new K and V rows written into a quantized store (StoreAttention::write_quantized).
struct RowWrite {
    int32_t head_dim = 0, n_head_kv = 0;
    int64_t n = 0;                   // new rows per segment
    char * dst[2] = {};              // the layer's K and V tensor data
    size_t row[2] = {};              // bytes of a K row and of a V row
    ggml_from_float_t from[2] = {};  // the CPU backend's quantizers of the two types
    int32_t rotation[2] = {};        // Hadamard sizes (0: none)
    std::vector<int64_t> first;      // [n_head_kv] the row of each segment's first new row
};

// src[0] = K, src[1] = V: F32 [head_dim, n_head_kv, n]. Rows dealt to threads in turn.
void op_write(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const RowWrite & w = *static_cast<const RowWrite *>(userdata);
    thread_local std::vector<float> tmp;
    tmp.resize(size_t(w.head_dim));
    const int64_t per = int64_t(w.n_head_kv) * w.n;
    for (int64_t u = ith; u < 2 * per; u += nth) {
        const int kv = int(u / per);
        const int h = int((u % per) / w.n);
        const int64_t i = u % w.n;
        const ggml_tensor * s = dst->src[kv];
        const auto * x =
            reinterpret_cast<const float *>(static_cast<const char *>(s->data) + i * s->nb[2] + h * s->nb[1]);
        std::copy(x, x + w.head_dim, tmp.begin());
        if (w.rotation[kv] > 0) hadamard_rows(tmp.data(), w.head_dim, w.rotation[kv]);
        w.from[kv](tmp.data(), w.dst[kv] + size_t(w.first[size_t(h)] + i) * w.row[kv], w.head_dim);
    }
}

// The attention of one evaluation over the KV store, as the AttentionFn the architecture
// calls per layer: writes the layer's new K/V rows into its segments (right after the rows
// held before the call, n_past), then attends with ggml's flash attention (a layer whose
// heads hold the same rows, attention=ggml) or kvlab's kernel. Owns what the graph's
// computation reads: the masks and the kernel problems.
class StoreAttention {
public:
    StoreAttention(ggml_context * ctx, ggml_cgraph * gf, const HParams & hp, const KvStore & cache,
                   std::vector<std::vector<int64_t>> n_past, const std::vector<int32_t> & pos, bool use_ggml,
                   bool observe_q, bool observe_x)
        : ctx_(ctx),
          gf_(gf),
          hp_(hp),
          cache_(cache),
          n_past_(std::move(n_past)),
          pos_(pos),
          use_ggml_(use_ggml),
          observe_q_(observe_q),
          observe_x_(observe_x),
          q_seen_(hp.n_layer, nullptr),
          x_seen_(hp.n_layer, nullptr),
          scale_(hp.kq_scale()),
          k_row_(cache.k_row_bytes()),
          v_row_(cache.v_row_bytes()) {}

    ggml_tensor * operator()(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * x) {
        if (observe_q_) {  // the queries as the model computed them (read_k() gives unrotated keys)
            ggml_set_output(q);
            q_seen_[il] = q;
        }
        if (observe_x_) {
            ggml_set_output(x);
            x_seen_[il] = x;
        }
        // rotated rows (CacheTypes::rotate): Q and K by H_kr, V by H_vr, the output back by H_vr
        const int32_t kr = cache_.types().k_rotation(hp_.head_dim), vr = cache_.types().v_rotation(hp_.head_dim);
        if (kr > 0) q = hadamard(q, kr);
        const std::vector<ggml_tensor *> writes =
            cache_.types().quantized() || kr > 0 || vr > 0 ? write_quantized(il, k, v, kr, vr) : write_rows(il, k, v);
        ggml_tensor * o = use_ggml_ && cache_.layer_uniform(il) ? flash(il, q) : kernel(il, q, writes);
        return vr > 0 ? hadamard(o, vr) : o;
    }

    // Uploads the masks and the Hadamard matrices (after the graph is allocated).
    void set_inputs() const {
        for (const auto & [t, m] : masks_) ggml_backend_tensor_set(t, m.data(), 0, m.size() * sizeof(ggml_fp16_t));
        for (const auto & [t, h] : rotations_) ggml_backend_tensor_set(t, h.data(), 0, h.size() * sizeof(float));
    }

    // Layer il's post-RoPE queries, F32 [head_dim, n_head, n] (graph outputs when observed).
    ggml_tensor * queries(int il) const { return q_seen_[il]; }
    // Layer il's hidden state entering the attention, F32 [n_embd, n] (graph outputs when observed).
    ggml_tensor * hidden(int il) const { return x_seen_[il]; }

private:
    int64_t n() const { return int64_t(pos_.size()); }

    // t's rows of n values times the n x n Hadamard matrix, as libllama's graph computes it: a
    // product tagged as a Hadamard matrix's, which ggml's CPU backend runs as a fast transform.
    ggml_tensor * hadamard(ggml_tensor * t, int32_t n) {
        ggml_tensor * h = nullptr;
        for (const auto & [r, m] : rotations_)
            if (r->ne[0] == n) h = r;
        if (!h) {
            h = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, n, n);
            ggml_set_input(h);
            std::vector<float> m(size_t(n) * n, 0.0f);
            for (int32_t i = 0; i < n; ++i) m[size_t(i) * n + i] = 1.0f;
            hadamard_rows(m.data(), int64_t(m.size()), n);  // the rows of I H = H
            rotations_.emplace_back(h, std::move(m));
        }
        const int64_t rows = ggml_nelements(t) / n;
        ggml_tensor * r = ggml_is_contiguous(t) ? ggml_reshape_2d(ctx_, t, n, rows) : ggml_cont_2d(ctx_, t, n, rows);
        r = ggml_mul_mat(ctx_, h, r);
        ggml_mul_mat_set_hint(r, GGML_HINT_SRC0_IS_HADAMARD);
        return ggml_reshape_4d(ctx_, r, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    }

    // The new rows of a quantized or rotated cache, every head's K and V in one node (a decode step's
    // writes would otherwise be 2 x n_head_kv quantizing copies and two rotations per layer,
    // each a barrier): each row rotated by the same butterflies ggml's CPU transform runs
    // (hadamard_rows: the same operations per element, so the same bits), then quantized by
    // the CPU backend's own from_float, as libllama's cache writes are.
    std::vector<ggml_tensor *> write_quantized(int il, ggml_tensor * k, ggml_tensor * v, int32_t kr, int32_t vr) {
        GGML_ASSERT(k->type == GGML_TYPE_F32 && v->type == GGML_TYPE_F32 && k->nb[0] == sizeof(float) &&
                    v->nb[0] == sizeof(float));
        auto w = std::make_unique<RowWrite>();
        w->head_dim = hp_.head_dim;
        w->n_head_kv = hp_.n_head_kv;
        w->n = n();
        w->dst[0] = static_cast<char *>(cache_.k(il)->data);
        w->dst[1] = static_cast<char *>(cache_.v(il)->data);
        w->row[0] = k_row_;
        w->row[1] = v_row_;
        w->from[0] = ggml_get_type_traits_cpu(cache_.types().k)->from_float;
        w->from[1] = ggml_get_type_traits_cpu(cache_.types().v)->from_float;
        w->rotation[0] = kr;
        w->rotation[1] = vr;
        for (int h = 0; h < hp_.n_head_kv; ++h) w->first.push_back(cache_.offset(il, h) + n_past_[il][h]);
        ggml_tensor * args[2] = {k, v};
        ggml_tensor * op =
            ggml_set_name(ggml_custom_4d(ctx_, GGML_TYPE_F32, 1, 1, 1, 1, args, 2, op_write, GGML_N_TASKS_MAX, w.get()),
                          "cache write");
        writes_.push_back(std::move(w));
        ggml_build_forward_expand(gf_, op);
        return {op};
    }

    // The new rows go through ggml's copy, which rounds to F16 or quantizes each row with the
    // CPU backend's own quantizer (what libllama's cache writes run).
    std::vector<ggml_tensor *> write_rows(int il, ggml_tensor * k, ggml_tensor * v) {
        ggml_tensor * kc = cache_.k(il);  // [head_dim, rows] of the cache's K type
        ggml_tensor * vc = cache_.v(il);
        std::vector<ggml_tensor *> writes;
        if (cache_.layer_uniform(il) && !cache_.types().quantized()) {
            // one [head_dim, n, n_head_kv] write into the [head_dim, cap, n_head_kv] block
            const size_t seg = size_t(cache_.capacity(il, 0)) * k_row_;
            const size_t at = size_t(n_past_[il][0]) * k_row_;
            ggml_tensor * kd = ggml_view_3d(ctx_, kc, hp_.head_dim, n(), hp_.n_head_kv, k_row_, seg, at);
            ggml_tensor * vd = ggml_view_3d(ctx_, vc, hp_.head_dim, n(), hp_.n_head_kv, v_row_, seg, at);
            writes.push_back(ggml_cpy(ctx_, ggml_permute(ctx_, k, 0, 2, 1, 3), kd));
            writes.push_back(ggml_cpy(ctx_, ggml_permute(ctx_, v, 0, 2, 1, 3), vd));
        } else {
            // per head (a quantizing copy needs a contiguous destination: one segment's new rows)
            for (int h = 0; h < hp_.n_head_kv; ++h) {
                const size_t row = size_t(cache_.offset(il, h) + n_past_[il][h]);
                ggml_tensor * ks = ggml_view_2d(ctx_, k, hp_.head_dim, n(), k->nb[2], h * k->nb[1]);
                ggml_tensor * vs = ggml_view_2d(ctx_, v, hp_.head_dim, n(), v->nb[2], h * v->nb[1]);
                writes.push_back(ggml_cpy(ctx_, ks, ggml_view_2d(ctx_, kc, hp_.head_dim, n(), k_row_, row * k_row_)));
                writes.push_back(ggml_cpy(ctx_, vs, ggml_view_2d(ctx_, vc, hp_.head_dim, n(), v_row_, row * v_row_)));
            }
        }
        for (ggml_tensor * w : writes) ggml_build_forward_expand(gf_, w);
        return writes;
    }

    // ggml's flash attention over the layer's block, with one causal mask per distinct
    // position set (layers that hold the same rows share it).
    ggml_tensor * flash(int il, ggml_tensor * q) {
        const std::vector<int32_t> & kpos = cache_.positions(il, 0);
        const int64_t n_kv = int64_t(kpos.size());
        const int32_t window = hp_.window(il);
        size_t mi = 0;
        while (mi < masks_.size() && (*mask_pos_[mi] != kpos || mask_window_[mi] != window)) ++mi;
        if (mi == masks_.size()) {
            ggml_tensor * mask = ggml_new_tensor_2d(ctx_, GGML_TYPE_F16, n_kv, n());  // F16 [n_kv, n]
            ggml_set_input(mask);
            std::vector<ggml_fp16_t> m(size_t(n_kv) * n());
            const ggml_fp16_t zero = ggml_fp32_to_fp16(0.0f), ninf = ggml_fp32_to_fp16(-INFINITY);
            for (int64_t i = 0; i < n(); ++i)
                for (int64_t j = 0; j < n_kv; ++j)
                    m[i * n_kv + j] = kpos[j] <= pos_[i] && (window == 0 || pos_[i] - kpos[j] < window) ? zero : ninf;
            masks_.emplace_back(mask, std::move(m));
            mask_pos_.push_back(&kpos);
            mask_window_.push_back(window);
        }
        const size_t cap = size_t(cache_.capacity(il, 0));
        ggml_tensor * ks = ggml_view_3d(ctx_, cache_.k(il), hp_.head_dim, n_kv, hp_.n_head_kv, k_row_, cap * k_row_, 0);
        ggml_tensor * vs = ggml_view_3d(ctx_, cache_.v(il), hp_.head_dim, n_kv, hp_.n_head_kv, v_row_, cap * v_row_, 0);
        ggml_tensor * qp = ggml_permute(ctx_, q, 0, 2, 1, 3);  // [head_dim, n, n_head]
        ggml_tensor * o = ggml_flash_attn_ext(ctx_, qp, ks, vs, masks_[mi].first, scale_, 0.0f, 0.0f);
        return ggml_reshape_2d(ctx_, o, int64_t(hp_.head_dim) * hp_.n_head, n());  // o: [head_dim, n_head, n]
    }

    // kvlab's kernel over every segment of the layer, after the writes of the new rows.
    ggml_tensor * kernel(int il, ggml_tensor * q, const std::vector<ggml_tensor *> & writes) {
        auto p = std::make_unique<kernels::attn::Problem>();
        p->n_q = int32_t(n());
        p->n_head = hp_.n_head;
        p->n_head_kv = hp_.n_head_kv;
        p->head_dim = hp_.head_dim;
        p->scale = scale_;
        p->q_pos = pos_.data();
        p->window = hp_.window(il);
        static_assert(KvStore::k_slide_rows % 512 == 0, "slide() frees whole chunks of the kernel");
        KVLAB_ASSERT(KvStore::k_slide_rows % p->chunk_rows == 0, "slide() frees whole chunks of the kernel");
        const auto * kd = static_cast<const char *>(cache_.k(il)->data);
        const auto * vd = static_cast<const char *>(cache_.v(il)->data);
        for (int h = 0; h < hp_.n_head_kv; ++h) {
            kernels::attn::Segment sg;
            sg.k = kd + cache_.offset(il, h) * k_row_;
            sg.v = vd + cache_.offset(il, h) * v_row_;
            sg.k_type = cache_.types().k;
            sg.v_type = cache_.types().v;
            sg.pos = cache_.positions(il, h).data();
            sg.n = cache_.n_rows(il, h);
            p->seg.push_back(sg);
        }
        if (cache_.types().mixed()) {  // the demoted runs
            const size_t lr = cache_.low_row_bytes();
            for (int h = 0; h < hp_.n_head_kv; ++h) {
                kernels::attn::Segment sg;
                sg.k = static_cast<const char *>(cache_.low_k(il)->data) + cache_.low_offset(il, h) * lr;
                sg.v = static_cast<const char *>(cache_.low_v(il)->data) + cache_.low_offset(il, h) * lr;
                sg.k_type = sg.v_type = cache_.types().low;
                sg.pos = cache_.low_positions(il, h).data();
                sg.n = cache_.n_low(il, h);
                p->low.push_back(sg);
            }
        }
        ggml_tensor * o = kernels::attn::build(ctx_, ggml_is_contiguous(q) ? q : ggml_cont(ctx_, q), p.get(), writes);
        problems_.push_back(std::move(p));
        return ggml_reshape_2d(ctx_, o, int64_t(hp_.head_dim) * hp_.n_head, n());
    }

    ggml_context * ctx_;
    ggml_cgraph * gf_;
    const HParams & hp_;
    const KvStore & cache_;
    std::vector<std::vector<int64_t>> n_past_;  // [n_layer][n_head_kv] rows held before the call
    const std::vector<int32_t> & pos_;          // [n] positions of the new tokens
    bool use_ggml_;
    bool observe_q_, observe_x_;
    std::vector<ggml_tensor *> q_seen_, x_seen_;  // [n_layer]
    float scale_;
    size_t k_row_, v_row_;  // bytes of one K row and of one V row
    std::vector<std::pair<ggml_tensor *, std::vector<ggml_fp16_t>>> masks_;
    std::vector<std::pair<ggml_tensor *, std::vector<float>>> rotations_;  // Hadamard matrices by size
    std::vector<const std::vector<int32_t> *> mask_pos_;                   // the position set of each mask
    std::vector<int32_t> mask_window_;                                     // and its window (0: causal only)
    std::vector<std::unique_ptr<kernels::attn::Problem>> problems_;
    std::vector<std::unique_ptr<RowWrite>> writes_;
};

// Rows held per segment: [n_layer][n_head_kv].
std::vector<std::vector<int64_t>> rows_held(const KvStore & cache) {
    std::vector<std::vector<int64_t>> n(cache.n_layer(), std::vector<int64_t>(cache.n_head_kv()));
    for (int il = 0; il < cache.n_layer(); ++il)
        for (int h = 0; h < cache.n_head_kv(); ++h) n[il][h] = cache.n_rows(il, h);
    return n;
}

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
    graph_meta_.resize(ggml_tensor_overhead() * k_max_nodes + ggml_graph_overhead_custom(k_max_nodes, false));
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
    return ggml_gallocr_get_buffer_size(galloc_.get(), 0);
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

    ggml_context_ptr ctx(ggml_init({graph_meta_.size(), graph_meta_.data(), true}));
    if (!ctx) throw Error("engine", "could not create the graph context");
    ggml_cgraph * gf = ggml_new_graph_custom(ctx.get(), k_max_nodes, false);
    GraphInputs in;
    in.tokens = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);       // I32 [n]
    in.pos = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);          // I32 [n]
    in.out_ids = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n_out);  // I32 [n_out]
    for (ggml_tensor * t : {in.tokens, in.pos, in.out_ids}) ggml_set_input(t);

    const bool wanted = observer && tok0 + n > observer->first;
    const bool observe_q = wanted && observer->on_queries, observe_x = wanted && observer->on_hidden;
    const bool observe = observe_q || observe_x;
    StoreAttention store(ctx.get(), gf, hp, cache, std::move(n_past), pos, opts_.attention == AttentionKernel::ggml,
                         observe_q, observe_x);
    const AttentionFn attention = [&store](int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * x) {
        return store(il, q, k, v, x);
    };
    ggml_tensor * logits =
        model_.arch().build_graph(GraphContext{ctx.get(), gf, hp, model_.products(), in, attention, &model_.panels()});
    ggml_set_output(logits);

    // ggml's allocator reuses its last plan for a graph of the same shape without looking at
    // output flags: a graph whose queries are outputs (observed) must get a fresh plan, or
    // their memory is shared with later nodes as in the unobserved graph before it.
    if (observe && !ggml_gallocr_reserve(galloc_.get(), gf))
        throw Error("engine", "could not reserve the compute buffer");
    if (!ggml_gallocr_alloc_graph(galloc_.get(), gf)) throw Error("engine", "could not allocate the compute buffer");
    advise_compute_buffer(logits->buffer);

    ggml_backend_tensor_set(in.tokens, tokens, 0, n * sizeof(int32_t));
    ggml_backend_tensor_set(in.pos, pos.data(), 0, n * sizeof(int32_t));
    ggml_backend_tensor_set(in.out_ids, out_ids.data(), 0, n_out * sizeof(int32_t));
    store.set_inputs();

    ggml_backend * be = own_backend_ ? own_backend_.get() : model_.backend();
    if (!own_backend_) model_.refresh_threads();  // -t 0: the CPUs other processes leave idle now
    ggml_status st = GGML_STATUS_SUCCESS;
    const auto run = [&] {
        st = ggml_backend_graph_compute(be, gf);
        ggml_backend_synchronize(be);
    };
    if (opts_.profile)
        opts_.profile->measure(gf, own_backend_ ? opts_.n_threads : model_.n_threads(), n, run);
    else
        run();
    if (st != GGML_STATUS_SUCCESS) throw Error("engine", "graph computation failed");
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

namespace {

// The log-probability of tok and the k best ones, from raw logits (no copy of them).
TokenLogprob token_logprobs(const std::vector<float> & logits, int32_t tok, int32_t k, std::vector<int32_t> & ids) {
    const float lse = log_sum_exp(logits);
    auto lp = [&](int32_t t) { return logits[t] - lse; };
    TokenLogprob r{tok, lp(tok), {}};
    ids.resize(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const size_t n_top = std::min<size_t>(size_t(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + n_top, ids.end(), [&](int32_t a, int32_t b) { return lp(a) > lp(b); });
    for (size_t j = 0; j < n_top; ++j) r.top.emplace_back(ids[j], lp(ids[j]));
    return r;
}

}  // namespace

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
