// The graph-store seam (store_attention.h): the new K/V rows written into the store's segments,
// then ggml's flash attention or kvlab's kernel over them.
#include "engine/store_attention.h"

#include <algorithm>
#include <cmath>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "kvlab/error.h"

namespace kvlab {

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

namespace {

// A thread's scratch: a row copied out before its rotation and quantization.
kernels::SliceSize write_scratch(const RowWrite & w) {
    return kernels::SliceSize().add<float>(size_t(w.head_dim));
}

// src[0] = K, src[1] = V: F32 [head_dim, n_head_kv, n], src[2] the graph's scratch. Rows dealt to
// threads in turn.
void op_write(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const RowWrite & w = *static_cast<const RowWrite *>(userdata);
    float * tmp =
        kernels::thread_slice(dst->src[2], write_scratch(w).bytes(), ith, nth).take<float>(size_t(w.head_dim));
    const int64_t per = int64_t(w.n_head_kv) * w.n;
    for (int64_t u = ith; u < 2 * per; u += nth) {
        const int kv = int(u / per);
        const int h = int((u % per) / w.n);
        const int64_t i = u % w.n;
        const ggml_tensor * s = dst->src[kv];
        const auto * x =
            reinterpret_cast<const float *>(static_cast<const char *>(s->data) + i * s->nb[2] + h * s->nb[1]);
        std::copy(x, x + w.head_dim, tmp);
        if (w.rotation[kv] > 0) hadamard_rows(tmp, w.head_dim, w.rotation[kv]);
        w.from[kv](tmp, w.dst[kv] + size_t(w.first[size_t(h)] + i) * w.row[kv], w.head_dim);
    }
}

}  // namespace

StoreAttention::StoreAttention(ggml_context * ctx, ggml_cgraph * gf, const HParams & hp, const KvStore & cache,
                               std::vector<std::vector<int64_t>> n_past, const std::vector<int32_t> & pos,
                               kernels::GraphScratch & scratch, bool use_ggml, bool observe_q, bool observe_x)
    : ctx_(ctx),
      gf_(gf),
      hp_(hp),
      cache_(cache),
      n_past_(std::move(n_past)),
      pos_(pos),
      scratch_(scratch),
      use_ggml_(use_ggml),
      observe_q_(observe_q),
      observe_x_(observe_x),
      q_seen_(hp.n_layer, nullptr),
      x_seen_(hp.n_layer, nullptr),
      scale_(hp.kq_scale()),
      k_row_(cache.k_row_bytes()),
      v_row_(cache.v_row_bytes()) {}

StoreAttention::~StoreAttention() = default;

ggml_tensor * StoreAttention::operator()(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * x) {
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
    const std::vector<ggml_tensor *> writes = write(il, k, v, kr, vr);
    ggml_tensor * o = use_ggml_ && cache_.layer_uniform(il) ? flash(il, q) : kernel(il, q, writes);
    return vr > 0 ? hadamard(o, vr) : o;
}

std::vector<ggml_tensor *> StoreAttention::write(int il, ggml_tensor * k, ggml_tensor * v, int32_t kr, int32_t vr) {
    return cache_.types().quantized() || kr > 0 || vr > 0 ? write_quantized(il, k, v, kr, vr) : write_rows(il, k, v);
}

void StoreAttention::set_inputs() const {
    for (const auto & [t, m] : masks_) ggml_backend_tensor_set(t, m.data(), 0, m.size() * sizeof(ggml_fp16_t));
    for (const auto & [t, h] : rotations_) ggml_backend_tensor_set(t, h.data(), 0, h.size() * sizeof(float));
}

ggml_tensor * StoreAttention::hadamard(ggml_tensor * t, int32_t n) {
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

std::vector<ggml_tensor *> StoreAttention::write_quantized(int il, ggml_tensor * k, ggml_tensor * v, int32_t kr,
                                                           int32_t vr) {
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
    ggml_tensor * args[3] = {k, v, scratch_.need(write_scratch(*w).bytes())};
    ggml_tensor * op = ggml_set_name(
        ggml_custom_4d(ctx_, GGML_TYPE_F32, 1, 1, 1, 1, args, 3, op_write, GGML_N_TASKS_MAX, w.get()), "cache write");
    writes_.push_back(std::move(w));
    ggml_build_forward_expand(gf_, op);
    return {op};
}

std::vector<ggml_tensor *> StoreAttention::write_rows(int il, ggml_tensor * k, ggml_tensor * v) {
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

ggml_tensor * StoreAttention::flash(int il, ggml_tensor * q) {
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

ggml_tensor * StoreAttention::kernel(int il, ggml_tensor * q, const std::vector<ggml_tensor *> & writes) {
    ggml_tensor * o =
        kernels::attn::build(ctx_, ggml_is_contiguous(q) ? q : ggml_cont(ctx_, q), problem(il), writes, scratch_);
    return ggml_reshape_2d(ctx_, o, int64_t(hp_.head_dim) * hp_.n_head, n());
}

const kernels::attn::Problem * StoreAttention::problem(int il) {
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
    problems_.push_back(std::move(p));
    return problems_.back().get();
}

}  // namespace kvlab
