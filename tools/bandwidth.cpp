#include "bandwidth.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gguf.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

uint64_t decode_bytes_per_token(const Model & model, const KvStore & cache) {
    uint64_t bytes = model.weight_bytes();
    const gguf_context * g = model.gguf();
    const int64_t emb = gguf_find_tensor(g, "token_embd.weight");
    if (emb >= 0 && gguf_find_tensor(g, "output.weight") >= 0) bytes -= gguf_get_tensor_size(g, emb);
    return bytes + cache.used_bytes();
}

namespace {

// Sums the 64-bit words of [p, p + n): the compiler vectorises the loop (integer adds, no
// reassociation question), so the loads, not the adds, bound it.
uint64_t sum_words(const uint64_t * p, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
    }
    for (; i < n; ++i) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

}  // namespace

double measure_read_bandwidth(int threads) {
    threads = std::max(1, threads);
    const size_t n = (size_t(256) << 20) / sizeof(uint64_t);
    // in transparent huge pages where the kernel offers them, as kvlab's weights (the bound is
    // the best read rate, not one that TLB misses slow down)
    constexpr size_t huge = size_t(2) << 20;
    std::unique_ptr<uint64_t[], decltype(&std::free)> buf(
        static_cast<uint64_t *>(std::aligned_alloc(huge, n * sizeof(uint64_t))), &std::free);
    if (!buf) throw Error("bench", "could not allocate 256 MiB to measure the read bandwidth");
    advise_huge_pages(buf.get(), n * sizeof(uint64_t));
    for (size_t i = 0; i < n; ++i) buf[i] = i;  // touched: resident, not the zero page
    double best = 0.0;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 5; ++pass) {
        std::vector<uint64_t> sums(size_t(threads), 0);
        const double t0 = now_seconds();
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                const size_t a = n * size_t(t) / size_t(threads), b = n * size_t(t + 1) / size_t(threads);
                sums[size_t(t)] = sum_words(buf.get() + a, b - a);
            });
        for (auto & t : ts) t.join();
        const double dt = now_seconds() - t0;
        for (uint64_t s : sums) sink = sink + s;
        best = std::max(best, double(n * sizeof(uint64_t)) / dt);
    }
    return best;
}

}  // namespace kvlab::cli
