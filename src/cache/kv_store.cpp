#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <utility>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kvlab/cache.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

ggml_type parse_cache_type(const std::string & name) {
    for (ggml_type t : {GGML_TYPE_F16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0})
        if (name == ggml_type_name(t)) return t;
    throw Error("cache", "unknown KV cache type '" + name + "' (choices: f16, q8_0, q4_0)");
}

const char * cache_type_name(ggml_type t) {
    return ggml_type_name(t);
}

int32_t CacheTypes::k_rotation(int32_t head_dim) const {
    if (!rotate || (k == GGML_TYPE_F16 && !mixed()) || head_dim % 64 != 0) return 0;
    int32_t n = 64;  // the largest power of two dividing head_dim (llama.cpp's choice for K)
    while (head_dim % (2 * n) == 0) n *= 2;
    return n;
}

int32_t CacheTypes::v_rotation(int32_t head_dim) const {
    return rotate && (v != GGML_TYPE_F16 || mixed()) && head_dim % 64 == 0 ? 64 : 0;  // llama.cpp's choice for V
}

void hadamard_rows(float * x, int64_t len, int32_t n) {
    const float scale = 1.0f / std::sqrt(float(n));
    for (int64_t r = 0; r + n <= len; r += n) {
        float * y = x + r;
        for (int32_t j = 0; j < n; ++j) y[j] *= scale;
        for (int32_t h = 1; h < n; h *= 2)  // butterflies: (u, v) -> (u + v, u - v)
            for (int32_t i = 0; i < n; i += 2 * h)
                for (int32_t j = i; j < i + h; ++j) {
                    const float u = y[j], v = y[j + h];
                    y[j] = u + v;
                    y[j + h] = u - v;
                }
    }
}

uint64_t cache_row_bytes(ggml_type t, int32_t head_dim) {
    return ggml_row_size(t, head_dim);
}

bool demotion_saves(ggml_type k, ggml_type v, ggml_type low, int32_t head_dim) {
    const uint64_t l = cache_row_bytes(low, head_dim);
    return l < cache_row_bytes(k, head_dim) && l < cache_row_bytes(v, head_dim);
}

KvStore::KvStore(const HParams & hp, ggml_backend * backend, CacheTypes types)
    : hp_(hp), backend_(backend), n_head_kv_(hp.n_head_kv), head_dim_(hp.head_dim), types_(types) {
    if (types.mixed() && types.low != GGML_TYPE_Q8_0 && types.low != GGML_TYPE_Q4_0)
        throw Error("cache", std::string("demoted rows of type ") + ggml_type_name(types.low) +
                                 ": the low type is one of q8_0, q4_0");
    for (ggml_type t : {types.k, types.v, types.mixed() ? types.low : types.k}) {
        if (t != GGML_TYPE_F16 && t != GGML_TYPE_Q8_0 && t != GGML_TYPE_Q4_0)
            throw Error("cache", std::string("KV cache type ") + ggml_type_name(t) + " is not one of f16, q8_0, q4_0");
        if (head_dim_ % ggml_blck_size(t) != 0)
            throw Error("cache", std::string("KV cache type ") + ggml_type_name(t) + " needs a head_dim that is a " +
                                     "multiple of " + std::to_string(ggml_blck_size(t)) + "; this model's is " +
                                     std::to_string(head_dim_));
    }
    layers_.resize(hp.n_layer);
    for (auto & l : layers_) {
        l.pos.assign(n_head_kv_, {});
        l.pos_lo.assign(n_head_kv_, {});
        l.off_lo.assign(n_head_kv_, 0);
    }
}

KvStore::KvStore(const HParams & hp, ggml_backend * backend, int64_t capacity, CacheTypes types)
    : KvStore(hp, backend, std::vector<std::vector<int64_t>>(hp.n_layer, std::vector<int64_t>(hp.n_head_kv, capacity)),
              types) {}

KvStore::KvStore(const HParams & hp, ggml_backend * backend, const std::vector<std::vector<int64_t>> & capacities,
                 CacheTypes types)
    : KvStore(hp, backend, types) {
    allocate(capacities, {});
}

KvStore KvStore::sibling(const Counts & capacities) const {
    KvStore s(hp_, backend_, types_);
    s.allocate(capacities, low_counts());
    return s;
}

KvStore::Counts KvStore::low_counts() const {
    Counts n(layers_.size());
    for (size_t il = 0; il < layers_.size(); ++il)
        for (const auto & p : layers_[il].pos_lo) n[il].push_back(int64_t(p.size()));
    return n;
}

void KvStore::allocate(const Counts & capacities, const Counts & low_counts) {
    KVLAB_ASSERT(capacities.size() == layers_.size(), "one capacity list per layer");
    KVLAB_ASSERT(low_counts.empty() || low_counts.size() == layers_.size(), "one demoted count list per layer");
    ggml_init_params params = {4 * capacities.size() * ggml_tensor_overhead(), nullptr, true};
    ctx_.reset(ggml_init(params));
    if (!ctx_) throw Error("cache", "could not create the KV tensor context");
    for (size_t il = 0; il < layers_.size(); ++il) {
        Layer & l = layers_[il];
        KVLAB_ASSERT(int32_t(capacities[il].size()) == n_head_kv_, "one capacity per KV head");
        l.cap.assign(n_head_kv_, 0);
        l.off.assign(n_head_kv_, 0);
        int64_t rows = 0;
        for (int h = 0; h < n_head_kv_; ++h) {
            l.cap[h] = std::max<int64_t>(1, capacities[il][h]);
            l.off[h] = rows;
            rows += l.cap[h];
        }
        l.k = ggml_new_tensor_2d(ctx_.get(), types_.k, head_dim_, rows);
        l.v = ggml_new_tensor_2d(ctx_.get(), types_.v, head_dim_, rows);
        ggml_format_name(l.k, "cache_k_l%zu", il);
        ggml_format_name(l.v, "cache_v_l%zu", il);
        if (!types_.mixed()) continue;
        int64_t low = 0;
        for (int h = 0; h < n_head_kv_; ++h) {
            l.off_lo[h] = low;
            low += low_counts.empty() ? 0 : low_counts[il][h];
        }
        l.k_lo = ggml_new_tensor_2d(ctx_.get(), types_.low, head_dim_, std::max<int64_t>(1, low));
        l.v_lo = ggml_new_tensor_2d(ctx_.get(), types_.low, head_dim_, std::max<int64_t>(1, low));
        ggml_format_name(l.k_lo, "cache_k_low_l%zu", il);
        ggml_format_name(l.v_lo, "cache_v_low_l%zu", il);
    }
    uint64_t need = 0, rows = 0;
    for (const auto & l : layers_) {
        need += ggml_nbytes(l.k) + ggml_nbytes(l.v);
        if (l.k_lo) need += ggml_nbytes(l.k_lo) + ggml_nbytes(l.v_lo);
        rows += uint64_t(l.k->ne[1]);
    }
    require_memory(need, "a KV cache of " + std::to_string(rows) + " rows (" + std::to_string(layers_.size()) +
                             " layers x " + std::to_string(n_head_kv_) + " KV heads, room for " +
                             std::to_string(rows / (layers_.size() * size_t(n_head_kv_))) + " tokens)");
    buffer_.reset(ggml_backend_alloc_ctx_tensors(ctx_.get(), backend_));
    if (!buffer_) throw Error("cache", "could not allocate " + std::to_string(bytes()) + " bytes of KV cache");
    // decode reads every row held on every token (read-only after written; huge pages where big enough)
    advise_huge_pages(ggml_backend_buffer_get_base(buffer_.get()), ggml_backend_buffer_get_size(buffer_.get()));
    ggml_backend_buffer_set_usage(buffer_.get(), GGML_BACKEND_BUFFER_USAGE_COMPUTE);
}

namespace {

// Checks saved positions against the model's shape: per layer, per KV head, ascending below
// next_pos; returns the counts.
std::vector<std::vector<int64_t>> checked_counts(const HParams & hp, const SegmentPositions & positions,
                                                 int32_t next_pos, const char * what) {
    if (int32_t(positions.size()) != hp.n_layer)
        throw Error("cache", std::string("saved ") + what + " for " + std::to_string(positions.size()) +
                                 " layers; the model has " + std::to_string(hp.n_layer));
    std::vector<std::vector<int64_t>> n(positions.size());
    for (size_t il = 0; il < positions.size(); ++il) {
        if (int32_t(positions[il].size()) != hp.n_head_kv)
            throw Error("cache", std::string("saved ") + what + " for " + std::to_string(positions[il].size()) +
                                     " KV heads in layer " + std::to_string(il) + "; the model has " +
                                     std::to_string(hp.n_head_kv));
        for (const auto & pos : positions[il]) {
            for (size_t j = 0; j < pos.size(); ++j)
                if (pos[j] < 0 || pos[j] >= next_pos || (j > 0 && pos[j] <= pos[j - 1]))
                    throw Error("cache", std::string("saved positions of ") + what + " of layer " + std::to_string(il) +
                                             " are not ascending positions below " + std::to_string(next_pos));
            n[il].push_back(int64_t(pos.size()));
        }
    }
    return n;
}

}  // namespace

KvStore KvStore::restore(const HParams & hp, ggml_backend * backend, SegmentPositions positions, int32_t next_pos,
                         int64_t reserve, CacheTypes types, SegmentPositions low_positions) {
    if (reserve < 0 || next_pos < 0) throw Error("cache", "a restored store needs a non-negative reserve and position");
    Counts caps = checked_counts(hp, positions, next_pos, "rows");
    for (auto & l : caps)
        for (int64_t & c : l) c += reserve;
    if (!types.mixed() && !low_positions.empty()) throw Error("cache", "demoted rows saved without their type");
    Counts low;
    if (types.mixed()) low = checked_counts(hp, low_positions, next_pos, "demoted rows");
    KvStore s(hp, backend, types);
    s.allocate(caps, low);
    s.next_pos_ = next_pos;
    for (size_t il = 0; il < positions.size(); ++il) {
        s.layers_[il].pos = std::move(positions[il]);
        if (types.mixed()) s.layers_[il].pos_lo = std::move(low_positions[il]);
    }
    return s;
}

void KvStore::read_rows(int il, int h, bool value, void * dst, bool low) const {
    const Layer & l = layers_[il];
    const ggml_tensor * t = low ? (value ? l.v_lo : l.k_lo) : (value ? l.v : l.k);
    const int64_t first = low ? l.off_lo[h] : l.off[h];
    const size_t n = size_t(low ? n_low(il, h) : n_rows(il, h)) * (t ? t->nb[1] : 0);
    if (n > 0) ggml_backend_tensor_get(t, dst, size_t(first) * t->nb[1], n);
}

void KvStore::write_rows(int il, int h, bool value, const void * src, bool low) {
    const Layer & l = layers_[il];
    ggml_tensor * t = low ? (value ? l.v_lo : l.k_lo) : (value ? l.v : l.k);
    const int64_t first = low ? l.off_lo[h] : l.off[h];
    const size_t n = size_t(low ? n_low(il, h) : n_rows(il, h)) * (t ? t->nb[1] : 0);
    if (n > 0) ggml_backend_tensor_set(t, src, size_t(first) * t->nb[1], n);
}

std::vector<std::vector<int64_t>> KvStore::capacities() const {
    std::vector<std::vector<int64_t>> caps;
    for (const auto & l : layers_) caps.push_back(l.cap);
    return caps;
}

std::vector<std::vector<int64_t>> KvStore::rows_per_segment() const {
    std::vector<std::vector<int64_t>> rows(layers_.size());
    for (size_t il = 0; il < layers_.size(); ++il)
        for (int h = 0; h < n_head_kv_; ++h) rows[il].push_back(n_rows(int(il), h) + n_low(int(il), h));
    return rows;
}

int64_t KvStore::total_rows() const {
    int64_t n = total_low_rows();
    for (const auto & l : layers_)
        for (const auto & p : l.pos) n += int64_t(p.size());
    return n;
}

int64_t KvStore::total_low_rows() const {
    int64_t n = 0;
    for (const auto & l : layers_)
        for (const auto & p : l.pos_lo) n += int64_t(p.size());
    return n;
}

bool KvStore::layer_uniform(int il) const {
    const Layer & l = layers_[il];
    for (int h = 0; h < n_head_kv_; ++h)
        if (l.cap[h] != l.cap[0] || l.pos[h] != l.pos[0] || !l.pos_lo[h].empty()) return false;
    return true;
}

bool KvStore::uniform() const {
    if (total_low_rows() > 0) return false;
    const auto & ref = layers_[0].pos[0];
    for (const auto & l : layers_)
        for (const auto & p : l.pos)
            if (p != ref) return false;
    return true;
}

namespace {

// Copies rows [0, n) of segment (src_off) of src into segment (dst_off) of dst.
void copy_segment(ggml_tensor * dst, int64_t dst_off, const ggml_tensor * src, int64_t src_off, int64_t n,
                  std::vector<uint8_t> & tmp) {
    const size_t bytes = size_t(n) * src->nb[1];
    if (bytes == 0) return;
    tmp.resize(bytes);
    ggml_backend_tensor_get(src, tmp.data(), src_off * src->nb[1], bytes);
    ggml_backend_tensor_set(dst, tmp.data(), dst_off * dst->nb[1], bytes);
}

}  // namespace

void KvStore::copy_low_to(KvStore & out) const {
    std::vector<uint8_t> tmp;
    for (size_t il = 0; il < layers_.size() && types_.mixed(); ++il) {
        const Layer & l = layers_[il];
        Layer & o = out.layers_[il];
        const int64_t n = l.k_lo->ne[1];  // the same layout: all the layer's demoted rows at once
        copy_segment(o.k_lo, 0, l.k_lo, 0, n, tmp);
        copy_segment(o.v_lo, 0, l.v_lo, 0, n, tmp);
        o.pos_lo = l.pos_lo;
        o.off_lo = l.off_lo;
    }
}

KvStore KvStore::copy(int64_t room) const {
    std::vector<std::vector<int64_t>> caps = capacities();
    for (size_t il = 0; il < layers_.size(); ++il)
        for (int h = 0; h < n_head_kv_; ++h) caps[il][h] = std::max(caps[il][h], n_rows(int(il), h) + room);
    KvStore out = sibling(caps);
    out.next_pos_ = next_pos_;
    out.freed_below_ = freed_below_;
    out.lost_rows_ = lost_rows_;
    std::vector<uint8_t> tmp;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const Layer & l = layers_[il];
        Layer & o = out.layers_[il];
        for (int h = 0; h < n_head_kv_; ++h) {
            copy_segment(o.k, o.off[h], l.k, l.off[h], n_rows(int(il), h), tmp);
            copy_segment(o.v, o.off[h], l.v, l.off[h], n_rows(int(il), h), tmp);
        }
        o.pos = l.pos;
    }
    copy_low_to(out);
    return out;
}

int64_t KvStore::max_window_rows(int il, int64_t batch) const {
    const int32_t w = window(il);
    if (w == 0 || hold_all_ || batch < 0) return -1;
    return int64_t(w) - 1 + k_slide_rows - 1 + batch;
}

int64_t KvStore::full_rows(int64_t L) const {
    int64_t rows = 0;
    for (int il = 0; il < n_layer(); ++il) {
        const int32_t w = window(il);
        const int64_t dead = w > 0 ? std::max<int64_t>(0, L - (w - 1)) : 0;  // what slide() frees: whole units
        rows += (L - dead / k_slide_rows * k_slide_rows) * n_head_kv_;
    }
    return rows;
}

void KvStore::reserve(int64_t n_more, int64_t batch) {
    bool grow = false;
    std::vector<std::vector<int64_t>> caps = capacities();
    const int64_t b = batch < 0 ? n_more : std::min(batch, n_more);
    for (size_t il = 0; il < layers_.size(); ++il)
        for (int h = 0; h < n_head_kv_; ++h) {
            const int64_t rows = n_rows(int(il), h);
            int64_t need = rows + n_more;
            const int64_t bound = max_window_rows(int(il), b);  // a sliding layer's most rows
            if (bound >= 0) need = std::max(rows + b, std::min(need, bound));
            int64_t & cap = caps[il][h];
            if (need > cap) {
                cap = std::max(need, bound >= 0 ? std::min(cap + cap / 2, bound) : cap + cap / 2);
                grow = true;
            }
        }
    if (!grow) return;
    KvStore bigger = sibling(caps);
    std::vector<uint8_t> tmp;
    for (size_t il = 0; il < layers_.size(); ++il) {
        Layer & l = layers_[il];
        Layer & b = bigger.layers_[il];
        for (int h = 0; h < n_head_kv_; ++h) {
            copy_segment(b.k, b.off[h], l.k, l.off[h], n_rows(int(il), h), tmp);
            copy_segment(b.v, b.off[h], l.v, l.off[h], n_rows(int(il), h), tmp);
        }
        b.pos = std::move(l.pos);
    }
    copy_low_to(bigger);
    bigger.next_pos_ = next_pos_;
    bigger.hold_all_ = hold_all_;
    bigger.freed_below_ = freed_below_;
    bigger.lost_rows_ = lost_rows_;
    *this = std::move(bigger);
}

void KvStore::slide() {
    if (hold_all_) return;
    std::vector<uint8_t> tmp;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const int32_t w = window(int(il));
        if (w == 0) continue;
        Layer & l = layers_[il];
        for (int h = 0; h < n_head_kv_; ++h) {
            std::vector<int32_t> & pos = l.pos[h];
            // rows at x <= next_pos - w: no query at next_pos or later sees them
            const int64_t dead = std::upper_bound(pos.begin(), pos.end(), next_pos_ - w) - pos.begin();
            const int64_t drop = dead / k_slide_rows * k_slide_rows;
            if (drop == 0) continue;
            const int64_t keep = int64_t(pos.size()) - drop;
            for (ggml_tensor * t : {l.k, l.v}) {
                const size_t row = t->nb[1];
                tmp.resize(size_t(keep) * row);
                if (keep > 0) {
                    ggml_backend_tensor_get(t, tmp.data(), size_t(l.off[h] + drop) * row, tmp.size());
                    ggml_backend_tensor_set(t, tmp.data(), size_t(l.off[h]) * row, tmp.size());
                }
            }
            freed_below_ = std::max(freed_below_, pos[size_t(drop - 1)] + 1);
            pos.erase(pos.begin(), pos.begin() + drop);
        }
    }
}

void KvStore::commit(int64_t n) {
    for (auto & l : layers_)
        for (int h = 0; h < n_head_kv_; ++h) {
            auto & p = l.pos[h];
            KVLAB_ASSERT(int64_t(p.size()) + n <= l.cap[h], "commit within capacity");
            for (int64_t i = 0; i < n; ++i) p.push_back(next_pos_ + int32_t(i));
        }
    next_pos_ += int32_t(n);
}

void KvStore::rollback(int64_t n) {
    KVLAB_ASSERT(n >= 0 && n <= next_pos_, "rollback of committed rows");
    const int32_t from = next_pos_ - int32_t(n);
    for (auto & l : layers_)
        for (auto & p : l.pos) {
            // the rows at positions >= from (slide() may have freed some of them already)
            const auto first = std::lower_bound(p.begin(), p.end(), from);
            KVLAB_ASSERT(p.end() - first <= n, "rollback of committed rows");
            p.erase(first, p.end());
        }
    next_pos_ -= int32_t(n);
    // a freed row at freed_below_ - 1 is seen again by a query at next_pos_ (w on its layer)
    for (int il = 0; il < n_layer(); ++il)
        if (window(il) > 0 && freed_below_ > 0 && freed_below_ - 1 > next_pos_ - window(il)) lost_rows_ = true;
}

namespace {

// Every row index of every segment of a run: [il][h] = 0 .. n-1.
KeepPlan all_rows(const std::vector<std::vector<int64_t>> & counts) {
    KeepPlan all(counts.size());
    for (size_t il = 0; il < counts.size(); ++il)
        for (int64_t n : counts[il]) {
            std::vector<int32_t> rows(static_cast<size_t>(n));
            for (size_t j = 0; j < rows.size(); ++j) rows[j] = int32_t(j);
            all[il].push_back(std::move(rows));
        }
    return all;
}

// The rows of `pos` below `limit`.
std::vector<int32_t> rows_below(const std::vector<int32_t> & pos, int32_t limit) {
    std::vector<int32_t> rows;
    for (size_t j = 0; j < pos.size() && pos[j] < limit; ++j) rows.push_back(int32_t(j));
    return rows;
}

void check_rows(const std::vector<int32_t> & rows, int64_t n, size_t il, int h, const char * what) {
    for (size_t i = 0; i < rows.size(); ++i)
        if (rows[i] < 0 || rows[i] >= n || (i > 0 && rows[i] <= rows[i - 1]))
            throw Error("cache", std::string(what) + " for layer " + std::to_string(il) + " head " + std::to_string(h) +
                                     " is not ascending unique rows in range");
}

// Rows of one segment moved between stores: `rows` of src (type st, rotated by srot) into
// consecutive rows of dst (type dt, rotated by drot) from row `at`. The same type and rotation:
// the bytes as they are; otherwise each row dequantized, rotated back, rotated the new way and
// quantized by ggml's reference quantizer.
struct RowMover {
    int32_t d = 0;
    std::vector<uint8_t> src;
    std::vector<uint8_t> dst;
    std::vector<float> f;

    void move(const ggml_tensor * s, int64_t s_off, int64_t s_n, int32_t srot, const std::vector<int32_t> & rows,
              ggml_tensor * t, int64_t at, int32_t drot) {
        if (rows.empty()) return;
        const size_t sr = s->nb[1], dr = t->nb[1];
        src.resize(size_t(s_n) * sr);
        ggml_backend_tensor_get(s, src.data(), size_t(s_off) * sr, src.size());
        dst.resize(rows.size() * dr);
        const bool same = s->type == t->type && srot == drot;
        f.resize(size_t(d));
        for (size_t i = 0; i < rows.size(); ++i) {
            const uint8_t * x = src.data() + size_t(rows[i]) * sr;
            if (same) {
                std::memcpy(dst.data() + i * dr, x, dr);
                continue;
            }
            ggml_get_type_traits(s->type)->to_float(x, f.data(), d);
            if (srot > 0) hadamard_rows(f.data(), d, srot);  // H H = I: rotated back
            if (drot > 0) hadamard_rows(f.data(), d, drot);
            ggml_quantize_chunk(t->type, f.data(), dst.data() + i * dr, 0, 1, d, nullptr);
        }
        ggml_backend_tensor_set(t, dst.data(), size_t(at) * dr, dst.size());
    }
};

}  // namespace

void KvStore::truncate(int32_t pos, int64_t reserve) {
    if (pos < 0 || pos > next_pos_) throw Error("cache", "truncate: position " + std::to_string(pos) + " out of range");
    KeepPlan keep(layers_.size()), low(layers_.size());
    for (size_t il = 0; il < layers_.size(); ++il)
        for (int h = 0; h < n_head_kv_; ++h) {
            keep[il].push_back(rows_below(layers_[il].pos[h], pos));
            low[il].push_back(rows_below(layers_[il].pos_lo[h], pos));
        }
    next_pos_ = pos;  // first: on sliding layers it frees what no query from pos on sees
    for (int il = 0; il < n_layer(); ++il)
        if (window(il) > 0 && freed_below_ > 0 && freed_below_ - 1 > next_pos_ - window(il)) lost_rows_ = true;
    drop_slid(keep);
    relayout(keep, {}, low, types_, reserve);
}

void KvStore::fit(int64_t reserve) {
    Counts n(layers_.size());
    for (size_t il = 0; il < layers_.size(); ++il)
        for (const auto & pos : layers_[il].pos) n[il].push_back(int64_t(pos.size()));
    compact(all_rows(n), reserve);
}

void KvStore::drop_slid(KeepPlan & keep) {
    for (size_t il = 0; il < layers_.size() && il < keep.size() && !hold_all_; ++il) {
        const int32_t w = window(int(il));
        if (w == 0 || keep[il].size() != size_t(n_head_kv_)) continue;
        for (int h = 0; h < n_head_kv_; ++h) {
            auto & rows = keep[il][h];
            int64_t dead = 0;
            while (dead < int64_t(rows.size()) && rows[dead] >= 0 && rows[dead] < n_rows(int(il), h) &&
                   layers_[il].pos[h][rows[dead]] <= next_pos_ - w)
                ++dead;
            const int64_t drop = dead / k_slide_rows * k_slide_rows;
            if (drop > 0) {
                freed_below_ = std::max(freed_below_, layers_[il].pos[h][rows[drop - 1]] + 1);
                rows.erase(rows.begin(), rows.begin() + drop);
            }
        }
    }
}

void KvStore::compact(const KeepPlan & plan, int64_t reserve) {
    if (plan.size() != layers_.size()) throw Error("cache", "a compaction plan needs one entry per layer");
    KeepPlan keep = plan;  // on sliding layers the rows slide() would free go now, before the new store is sized
    drop_slid(keep);
    relayout(keep, {}, all_rows(low_counts()), types_, reserve);
}

void KvStore::compact_mixed(const KeepPlan & high, const KeepPlan & low, ggml_type low_type, int64_t reserve) {
    if (types_.mixed() && types_.low != low_type)
        throw Error("cache", std::string("this store already holds rows demoted to ") + ggml_type_name(types_.low) +
                                 "; it cannot demote rows to " + ggml_type_name(low_type) + " as well");
    CacheTypes t = types_;
    t.low = low_type;
    if (high.size() != layers_.size()) throw Error("cache", "a compaction plan needs one entry per layer");
    KeepPlan keep = high;
    drop_slid(keep);
    relayout(keep, low, all_rows(low_counts()), t, reserve);
}

void KvStore::relayout(const KeepPlan & high, const KeepPlan & demote, const KeepPlan & low_keep, CacheTypes types,
                       int64_t reserve) {
    if (reserve < 0) throw Error("cache", "the reserve cannot be negative");
    if (high.size() != layers_.size() || (!demote.empty() && demote.size() != layers_.size()))
        throw Error("cache", "a compaction plan needs one entry per layer");
    const bool demoting = !demote.empty();
    Counts caps(layers_.size()), lows(layers_.size());
    for (size_t il = 0; il < layers_.size(); ++il) {
        if (int32_t(high[il].size()) != n_head_kv_ || (demoting && int32_t(demote[il].size()) != n_head_kv_))
            throw Error("cache", "a compaction plan needs one entry per KV head (layer " + std::to_string(il) + ")");
        for (int h = 0; h < n_head_kv_; ++h) {
            check_rows(high[il][h], n_rows(int(il), h), il, h, "compaction plan");
            int64_t low = int64_t(low_keep[il][h].size());
            if (demoting) {
                check_rows(demote[il][h], n_rows(int(il), h), il, h, "demotion plan");
                std::vector<int32_t> both;
                std::set_intersection(high[il][h].begin(), high[il][h].end(), demote[il][h].begin(),
                                      demote[il][h].end(), std::back_inserter(both));
                if (!both.empty())
                    throw Error("cache", "layer " + std::to_string(il) + " head " + std::to_string(h) + ": row " +
                                             std::to_string(both[0]) + " is both kept and demoted");
                low += int64_t(demote[il][h].size());
            }
            caps[il].push_back(int64_t(high[il][h].size()) + reserve);
            lows[il].push_back(low);
        }
    }
    KvStore out(hp_, backend_, types);
    out.allocate(caps, lows);
    out.next_pos_ = next_pos_;
    out.hold_all_ = hold_all_;
    out.freed_below_ = freed_below_;
    out.lost_rows_ = lost_rows_;
    const int32_t kr0 = types_.k_rotation(head_dim_), vr0 = types_.v_rotation(head_dim_);
    const int32_t kr1 = types.k_rotation(head_dim_), vr1 = types.v_rotation(head_dim_);
    RowMover mv;
    mv.d = head_dim_;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const Layer & l = layers_[il];
        Layer & o = out.layers_[il];
        for (int h = 0; h < n_head_kv_; ++h) {
            const auto & rows = high[il][h];
            const int64_t n = n_rows(int(il), h);
            mv.move(l.k, l.off[h], n, kr0, rows, o.k, o.off[h], kr1);
            mv.move(l.v, l.off[h], n, vr0, rows, o.v, o.off[h], vr1);
            for (int32_t r : rows) o.pos[h].push_back(l.pos[h][r]);
            if (!types.mixed()) continue;
            // the new demoted run: demoted rows and kept demoted rows, merged by position
            static const std::vector<int32_t> none;
            const std::vector<int32_t> & dem = demoting ? demote[il][h] : none;
            const std::vector<int32_t> & old = low_keep[il][h];
            int64_t at = o.off_lo[h];
            size_t a = 0, b = 0;
            while (a < dem.size() || b < old.size()) {
                // the longest stretch from one source, then the other
                std::vector<int32_t> from_main, from_low;
                while (a < dem.size() && (b == old.size() || l.pos[h][dem[a]] < l.pos_lo[h][old[b]]))
                    from_main.push_back(dem[a++]);
                if (!from_main.empty()) {
                    mv.move(l.k, l.off[h], n, kr0, from_main, o.k_lo, at, kr1);
                    mv.move(l.v, l.off[h], n, vr0, from_main, o.v_lo, at, vr1);
                    for (int32_t r : from_main) o.pos_lo[h].push_back(l.pos[h][r]);
                    at += int64_t(from_main.size());
                }
                while (b < old.size() && (a == dem.size() || l.pos_lo[h][old[b]] <= l.pos[h][dem[a]]))
                    from_low.push_back(old[b++]);
                if (!from_low.empty()) {
                    mv.move(l.k_lo, l.off_lo[h], n_low(int(il), h), kr0, from_low, o.k_lo, at, kr1);
                    mv.move(l.v_lo, l.off_lo[h], n_low(int(il), h), vr0, from_low, o.v_lo, at, vr1);
                    for (int32_t r : from_low) o.pos_lo[h].push_back(l.pos_lo[h][r]);
                    at += int64_t(from_low.size());
                }
            }
        }
    }
    *this = std::move(out);
}

namespace {
// rotation: the Hadamard size the rows were rotated by (0: none), undone here.
std::vector<float> rows_as_float(const ggml_tensor * t, int64_t off, int64_t n, int64_t dim, int32_t rotation) {
    std::vector<uint8_t> raw(size_t(n) * t->nb[1]);
    if (n > 0) ggml_backend_tensor_get(t, raw.data(), off * t->nb[1], raw.size());
    std::vector<float> out(size_t(n * dim));
    ggml_get_type_traits(t->type)->to_float(raw.data(), out.data(), n * dim);  // rows are whole blocks
    if (rotation > 0) hadamard_rows(out.data(), n * dim, rotation);
    return out;
}
}  // namespace

std::vector<float> KvStore::read_k(int il, int h) const {
    return rows_as_float(layers_[il].k, layers_[il].off[h], n_rows(il, h), head_dim_, types_.k_rotation(head_dim_));
}

std::vector<float> KvStore::read_k(int il, int h, int64_t row0, int64_t n) const {
    KVLAB_ASSERT(row0 >= 0 && n >= 0 && row0 + n <= n_rows(il, h), "rows within the segment");
    return rows_as_float(layers_[il].k, layers_[il].off[h] + row0, n, head_dim_, types_.k_rotation(head_dim_));
}

std::vector<float> KvStore::read_v(int il, int h) const {
    return rows_as_float(layers_[il].v, layers_[il].off[h], n_rows(il, h), head_dim_, types_.v_rotation(head_dim_));
}

std::vector<float> KvStore::read_v(int il, int h, int64_t row0, int64_t n) const {
    KVLAB_ASSERT(row0 >= 0 && n >= 0 && row0 + n <= n_rows(il, h), "rows within the segment");
    return rows_as_float(layers_[il].v, layers_[il].off[h] + row0, n, head_dim_, types_.v_rotation(head_dim_));
}

std::vector<float> KvStore::read_low(int il, int h, bool value) const {
    if (!types_.mixed()) return {};
    const Layer & l = layers_[il];
    return rows_as_float(value ? l.v_lo : l.k_lo, l.off_lo[h], n_low(il, h), head_dim_,
                         value ? types_.v_rotation(head_dim_) : types_.k_rotation(head_dim_));
}

uint64_t KvStore::k_row_bytes() const {
    return cache_row_bytes(types_.k, head_dim_);
}

uint64_t KvStore::v_row_bytes() const {
    return cache_row_bytes(types_.v, head_dim_);
}

uint64_t KvStore::low_row_bytes() const {
    return types_.mixed() ? cache_row_bytes(types_.low, head_dim_) : 0;
}

uint64_t KvStore::row_bytes() const {
    return k_row_bytes() + v_row_bytes();
}

uint64_t KvStore::bytes() const {
    // the backend buffer as allocated (tensor alignment padding included)
    if (buffer_) return ggml_backend_buffer_get_size(buffer_.get());
    uint64_t b = 0;
    for (const auto & l : layers_) b += ggml_nbytes(l.k) + ggml_nbytes(l.v);
    return b;
}

uint64_t KvStore::used_bytes() const {
    const int64_t low = total_low_rows();
    return uint64_t(total_rows() - low) * row_bytes() + uint64_t(low) * 2 * low_row_bytes();
}

}  // namespace kvlab
