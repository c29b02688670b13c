#include "kvlab/cache.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kvlab/error.h"

namespace kvlab {

KvStore::KvStore(const HParams & hp, ggml_backend * backend, int64_t capacity)
    : KvStore(hp, backend, std::vector<int64_t>(hp.n_layer, capacity)) {}

KvStore::KvStore(const HParams & hp, ggml_backend * backend, const std::vector<int64_t> & capacities)
    : hp_(hp), backend_(backend), n_head_kv_(hp.n_head_kv), head_dim_(hp.head_dim) {
    KVLAB_ASSERT(int32_t(capacities.size()) == hp.n_layer, "one capacity per layer");
    layers_.resize(hp.n_layer);
    for (auto & l : layers_) l.pos.assign(n_head_kv_, {});
    allocate(capacities);
}

KvStore::~KvStore() { release(); }

KvStore::KvStore(KvStore && o) noexcept { *this = std::move(o); }

KvStore & KvStore::operator=(KvStore && o) noexcept {
    if (this != &o) {
        release();
        hp_ = o.hp_;
        backend_ = o.backend_;
        n_head_kv_ = o.n_head_kv_;
        head_dim_ = o.head_dim_;
        next_pos_ = o.next_pos_;
        ctx_ = std::exchange(o.ctx_, nullptr);
        buffer_ = std::exchange(o.buffer_, nullptr);
        layers_ = std::move(o.layers_);
    }
    return *this;
}

void KvStore::release() {
    if (buffer_) ggml_backend_buffer_free(buffer_);
    if (ctx_) ggml_free(ctx_);
    buffer_ = nullptr;
    ctx_ = nullptr;
}

void KvStore::allocate(const std::vector<int64_t> & capacities) {
    ggml_init_params params = {2 * capacities.size() * ggml_tensor_overhead(), nullptr, true};
    ctx_ = ggml_init(params);
    if (!ctx_) throw Error("cache", "could not create the KV tensor context");
    for (size_t il = 0; il < layers_.size(); ++il) {
        const int64_t cap = std::max<int64_t>(1, capacities[il]);
        layers_[il].capacity = cap;
        layers_[il].k = ggml_new_tensor_3d(ctx_, GGML_TYPE_F16, head_dim_, cap, n_head_kv_);
        layers_[il].v = ggml_new_tensor_3d(ctx_, GGML_TYPE_F16, head_dim_, cap, n_head_kv_);
        ggml_format_name(layers_[il].k, "cache_k_l%zu", il);
        ggml_format_name(layers_[il].v, "cache_v_l%zu", il);
    }
    buffer_ = ggml_backend_alloc_ctx_tensors(ctx_, backend_);
    if (!buffer_) throw Error("cache", "could not allocate " + std::to_string(bytes()) + " bytes of KV cache");
    ggml_backend_buffer_set_usage(buffer_, GGML_BACKEND_BUFFER_USAGE_COMPUTE);
}

int64_t KvStore::max_rows(int il) const {
    int64_t n = 0;
    for (const auto & p : layers_[il].pos) n = std::max<int64_t>(n, int64_t(p.size()));
    return n;
}

bool KvStore::uniform() const {
    const auto & ref = layers_[0].pos[0];
    for (const auto & l : layers_)
        for (const auto & p : l.pos)
            if (p != ref) return false;
    return true;
}

namespace {
// Copies the first n rows of every head segment of src into dst (same head_dim / heads).
void copy_rows(ggml_tensor * dst, const ggml_tensor * src, int64_t n) {
    KVLAB_ASSERT(n <= dst->ne[1] && n <= src->ne[1], "copy fits");
    for (int64_t h = 0; h < src->ne[2]; ++h) {
        const size_t bytes = size_t(n) * src->nb[1];
        if (bytes == 0) continue;
        std::vector<uint8_t> tmp(bytes);
        ggml_backend_tensor_get(src, tmp.data(), h * src->nb[2], bytes);
        ggml_backend_tensor_set(dst, tmp.data(), h * dst->nb[2], bytes);
    }
}
}  // namespace

KvStore KvStore::copy() const {
    std::vector<int64_t> caps;
    for (const auto & l : layers_) caps.push_back(l.capacity);
    KvStore out(hp_, backend_, caps);
    out.next_pos_ = next_pos_;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const int64_t n = max_rows(int(il));
        copy_rows(out.layers_[il].k, layers_[il].k, n);
        copy_rows(out.layers_[il].v, layers_[il].v, n);
        out.layers_[il].pos = layers_[il].pos;
    }
    return out;
}

void KvStore::reserve(int64_t n_more) {
    bool grow = false;
    std::vector<int64_t> caps;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const int64_t need = max_rows(int(il)) + n_more;
        const int64_t cap = layers_[il].capacity;
        caps.push_back(need <= cap ? cap : std::max(need, cap + cap / 2));
        grow |= need > cap;
    }
    if (!grow) return;
    KvStore bigger(hp_, backend_, caps);
    for (size_t il = 0; il < layers_.size(); ++il) {
        const int64_t n = max_rows(int(il));
        copy_rows(bigger.layers_[il].k, layers_[il].k, n);
        copy_rows(bigger.layers_[il].v, layers_[il].v, n);
        bigger.layers_[il].pos = std::move(layers_[il].pos);
    }
    bigger.next_pos_ = next_pos_;
    *this = std::move(bigger);
}

void KvStore::commit(int64_t n) {
    for (auto & l : layers_)
        for (auto & p : l.pos) {
            KVLAB_ASSERT(int64_t(p.size()) + n <= l.capacity, "commit within capacity");
            for (int64_t i = 0; i < n; ++i) p.push_back(next_pos_ + int32_t(i));
        }
    next_pos_ += int32_t(n);
}

uint64_t KvStore::row_bytes() const { return 2 * uint64_t(head_dim_) * ggml_type_size(GGML_TYPE_F16); }

uint64_t KvStore::bytes() const {
    uint64_t b = 0;
    for (const auto & l : layers_) b += ggml_nbytes(l.k) + ggml_nbytes(l.v);
    return b;
}

uint64_t KvStore::used_bytes() const {
    uint64_t rows = 0;
    for (const auto & l : layers_)
        for (const auto & p : l.pos) rows += p.size();
    return rows * row_bytes();
}

}  // namespace kvlab
