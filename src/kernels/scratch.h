// Working memory of kvlab's graph nodes, from ggml's graph allocator rather than each thread's heap:
// counted in Engine::compute_bytes, freed with the engine. A graph has one scratch tensor
// (GraphScratch) with one slice per thread the graph computes on (the engine builds its graphs
// for the threads that compute them); each thread takes its own slice. In a slice, pieces are
// taken in the order they were sized, each on its own cache lines.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ggml.h"
#include "kvlab/error.h"

namespace kvlab::kernels {

constexpr size_t k_line = 64;
// Slices begin this far apart beyond their size, the first this far into the tensor: an odd
// number of lines, so that the threads' slices (and the engine's page-aligned buffer) do not
// start at the same offsets within 4 KiB pages. With slices packed end to end from the buffer's
// start, decode attention at 4,096 rows ran ~9% slower than from the threads' own heap buffers
// (smollm2-135m, 2 threads, AMD EPYC Zen 4, medians of interleaved runs); staggered, as fast.
constexpr size_t k_stagger = 17 * k_line;

constexpr size_t whole_lines(size_t bytes) {
    return (bytes + k_line - 1) / k_line * k_line;
}

// The bytes of a slice: pieces of n values of T, each beginning on a cache line.
class SliceSize {
public:
    template <class T>
    SliceSize & add(size_t n) {
        bytes_ += whole_lines(n * sizeof(T));
        return *this;
    }
    SliceSize & add(const SliceSize & other) {
        bytes_ += other.bytes_;
        return *this;
    }
    size_t bytes() const { return bytes_; }

private:
    size_t bytes_ = 0;
};

// One thread's slice: its pieces taken in the order its SliceSize added them.
class Slice {
public:
    Slice() = default;
    Slice(uint8_t * base, size_t bytes) : base_(base), bytes_(bytes) {}
    template <class T>
    T * take(size_t n) {
        const size_t b = whole_lines(n * sizeof(T));
        KVLAB_ASSERT(used_ + b <= bytes_, "a kernel took more scratch than its node was sized for");
        T * p = reinterpret_cast<T *>(base_ + used_);
        used_ += b;
        return p;
    }

private:
    uint8_t * base_ = nullptr;
    size_t bytes_ = 0, used_ = 0;
};

// Bytes of n_threads slices of `slice` bytes, staggered (a line more to align the first).
inline size_t scratch_bytes(size_t slice, int n_threads) {
    return slice == 0 ? 0 : (whole_lines(slice) + k_stagger) * size_t(n_threads) + k_line;
}

// A graph's scratch: one tensor that every kvlab node of the graph takes its threads' slices from,
// as ggml-cpu's own operations share its work buffer (the nodes run one after another, so one
// node's scratch is free when the next begins; the same lines stay in the threads' caches). Nodes
// record the slice they need as they are built; finish() sizes the tensor for the largest, times
// the threads the graph computes on. The engine places it in a buffer of its own (the same memory
// graph after graph, counted in Engine::compute_bytes); a graph without one lets ggml's
// allocator place it.
class GraphScratch {
public:
    GraphScratch(ggml_context * ctx, int n_threads) : n_threads_(n_threads) {
        KVLAB_ASSERT(n_threads >= 1, "a graph computes on at least one thread");
        t_ = ggml_set_name(ggml_new_tensor_1d(ctx, GGML_TYPE_I8, int64_t(k_line)), "kvlab scratch");
    }
    // A node that needs `slice` bytes per thread: the tensor, to be one of its sources.
    ggml_tensor * need(size_t slice) {
        max_ = std::max(max_, slice);
        return t_;
    }
    void finish() {
        const int64_t n = int64_t(std::max(scratch_bytes(max_, n_threads_), k_line));
        t_->ne[0] = n;
        t_->nb[1] = t_->nb[2] = t_->nb[3] = size_t(n);
    }
    size_t bytes() const { return ggml_nbytes(t_); }
    ggml_tensor * tensor() const { return t_; }

private:
    ggml_tensor * t_;
    int n_threads_;
    size_t max_ = 0;
};

// Thread ith's slice of `slice` bytes in a graph's scratch tensor.
inline Slice thread_slice(const ggml_tensor * scratch, size_t slice, int ith, int nth) {
    if (slice == 0) return {};
    const size_t per = whole_lines(slice) + k_stagger;
    KVLAB_ASSERT(scratch_bytes(slice, nth) <= ggml_nbytes(scratch),
                 "a kernel node runs on more threads, or needs more scratch, than its graph's scratch was sized for");
    const auto at = reinterpret_cast<uintptr_t>(scratch->data);
    auto * first = reinterpret_cast<uint8_t *>(whole_lines(at)) + k_stagger;
    return Slice(first + per * size_t(ith), whole_lines(slice));
}

// Scratch outside a graph (tests, tools): n_threads slices in a buffer of its own, filled with
// `fill` (what a slice held before must not matter to a kernel).
class ScratchBuffer {
public:
    ScratchBuffer(size_t slice, int n_threads, uint8_t fill = 0)
        : per_(whole_lines(slice)), bytes_(scratch_bytes(slice, n_threads), fill) {}
    Slice slice(int ith) {
        if (per_ == 0) return {};
        const auto at = reinterpret_cast<uintptr_t>(bytes_.data());
        return Slice(bytes_.data() + (whole_lines(at) - at) + per_ * size_t(ith), per_);
    }

private:
    size_t per_;
    std::vector<uint8_t> bytes_;
};

}  // namespace kvlab::kernels
