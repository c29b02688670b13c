// The hidden states entering each layer's attention (after the layer's input norm: what its
// Q/K/V projections read; kvpress's `hidden_states`) of every context token, captured while the
// context is prefilled: what Python scorers that ask for `hidden_states` get
// (python/src/scorer.cpp). KVzap (methods/kvzap.cpp) reads the same states from the engine
// (QueryObserver::on_hidden) but scores them on the fly instead of keeping them.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/model.h"
#include "kvlab/observer.h"

namespace kvlab::press {

class HiddenStates {
public:
    // Starts a capture of the hidden states of the L tokens about to be prefilled (n_layer x L x
    // n_embd floats); observe_s accumulates the seconds spent in the observer. Valid while this lives.
    const QueryObserver * observe(const HParams & hp, int64_t L, double * observe_s);
    // Whether every layer saw every one of the L context tokens.
    bool complete(int64_t L) const;
    // Layer il's hidden states, [L][n_embd], moved out: each layer's can be taken once.
    std::vector<float> take(int il);

private:
    int64_t L_ = 0, n_embd_ = 0;
    std::vector<int64_t> seen_;          // [layer] tokens seen
    std::vector<std::vector<float>> x_;  // [layer][L][n_embd]
    QueryObserver obs_;
};

}  // namespace kvlab::press
