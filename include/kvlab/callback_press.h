// A compression method whose scores come from a function of the caller's (kvlab.compress with a
// Python scorer, docs/python.md "Python scorers"): called once per layer with that layer's rows
// and what it asked of the prefill (the observation window's queries and attention weights, the
// hidden states); kvlab's own policies select the rows and compress() frees the others, as for any
// registered method. The press is an ordinary Press: ContextSession and compress_in_place take it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvlab/press.h"

namespace kvlab {

// One layer's inputs of a scoring function, float32, moved to it (it may keep them).
struct LayerRows {
    int layer = 0;
    int64_t rows = 0;                 // L, the context's rows
    int64_t window_rows = 0;          // w, the observation window's rows (0: none asked)
    std::vector<float> keys, values;  // [kv_heads][L][head_dim] (post-RoPE keys)
    std::vector<float> queries;       // asked: the window's queries [n_head][w][head_dim]
    std::vector<float> attentions;    // asked: the window's attention weights [n_head][w][L]
    std::vector<float> hidden;        // asked: the hidden states entering the layer's attention [L][n_embd]
};

struct CallbackScorer {
    std::string name;
    // How the scores become kept rows: uniform (each head its own top rows, every layer the
    // budget), layer (one row set per layer: the heads' mean score), global (Ada-KV's allocation
    // across each layer's heads, safeguard alpha), model (one ranking over every compressed layer
    // and head, as KVzip's).
    std::string per = "uniform";
    int64_t n_sink = 0, window = 0;  // the first and last rows always kept
    int64_t observed = 0;            // the window of queries observed: the last `observed` context tokens (0: none)
    bool queries = false, attentions = false, hidden_states = false;  // what LayerRows carries
    double alpha = 0.2;
    // The scores of one layer, [kv_heads][L] (higher kept first; the kept-anyway rows' are
    // ignored); asked once per layer and compression. An exception it throws ends the compression
    // with the cache unchanged.
    std::function<std::vector<std::vector<float>>(LayerRows && rows)> score;
    // Whether it scores from the prefill (queries, attentions or hidden states).
    bool observes() const { return observed > 0 || hidden_states; }
};

// Throws kvlab::Error for a spec that cannot run (an unknown `per`, negative counts, attentions
// or queries without a window).
std::unique_ptr<Press> make_callback_press(CallbackScorer spec, const Model & model);

}  // namespace kvlab
