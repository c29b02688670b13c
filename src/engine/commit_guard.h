// What an evaluation does to its caches before its graph runs, undone if anything throws.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/cache.h"

namespace kvlab {

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

// Rows held per segment: [n_layer][n_head_kv].
inline std::vector<std::vector<int64_t>> rows_held(const KvStore & cache) {
    std::vector<std::vector<int64_t>> n(cache.n_layer(), std::vector<int64_t>(cache.n_head_kv()));
    for (int il = 0; il < cache.n_layer(); ++il)
        for (int h = 0; h < cache.n_head_kv(); ++h) n[il][h] = cache.n_rows(il, h);
    return n;
}

}  // namespace kvlab
