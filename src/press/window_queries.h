// The queries of the last `w` context tokens, captured while the context is prefilled: what the
// SnapKV family's window scorer (methods/snapkv.cpp) and Python scorers that ask for queries
// (python/src/scorer.cpp) score from.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/model.h"
#include "kvlab/observer.h"

namespace kvlab::press {

class WindowQueries {
public:
    // Starts a capture of the queries of the last min(w, L) of the L tokens about to be
    // prefilled; observe_s accumulates the seconds spent in the observer. Valid while this lives.
    const QueryObserver * observe(const HParams & hp, int64_t w, int64_t L, double * observe_s);
    // Whether the capture saw its whole window of a context of L tokens.
    bool complete(int64_t L) const { return !q_.empty() && L == L_ && seen_ >= rows_; }
    int64_t rows() const { return rows_; }
    // Layer il's queries, [rows][n_head][head_dim].
    const float * layer(int il) const { return q_[size_t(il)].data(); }

private:
    int64_t L_ = 0, rows_ = 0, seen_ = 0;
    std::vector<std::vector<float>> q_;  // [layer][rows][n_head][head_dim]
    QueryObserver obs_;
};

}  // namespace kvlab::press
