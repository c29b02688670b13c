// Where a graph's time goes, thread by thread (`kvlab profile`, docs/benchmarks.md). While a
// profile is attached to an engine (EngineOptions::profile), every node of kvlab's own (weight
// products, activation packing, attention, cache writes) is timed on each thread that runs it: how
// long the thread computed in it, and how long it then waited at the barrier after it for the
// slowest thread. ggml's own nodes (norms, rope, additions, copies) are not timed one by one: with
// their barriers and the dispatch between nodes they are what remains of each thread's wall time.
// Nothing is timed, and nothing costs, without a profile.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct ggml_cgraph;

namespace kvlab {

class OpProfile {
public:
    // Node names, layer numbers removed ("product q5_0 ffn_down.weight", "attention").
    struct Op {
        std::string name;
        int64_t calls = 0;
        double wall_s = 0.0;         // first thread in to last thread out, summed over calls
        std::vector<double> busy_s;  // [thread] computing in the node
        std::vector<double> wait_s;  // [thread] at the barrier after it, for the slowest thread
    };
    struct Phase {
        std::string name;
        int n_threads = 0;
        int64_t graphs = 0, tokens = 0, ggml_nodes = 0;  // ggml_nodes: ggml's own nodes computed
        double wall_s = 0.0;                             // the graphs' computation, summed
        std::vector<Op> ops;                             // in the order first met
        std::vector<double> other_s;                     // [thread] wall_s minus its busy and wait time
    };

    // Checks that this ggml's custom-node parameters have the layout the profile rewrites (a
    // kvlab::Error otherwise).
    OpProfile();

    // The phase that the graphs computed from now on count in; empty: none (not instrumented).
    void set_phase(const std::string & phase) { phase_ = phase; }
    const std::vector<Phase> & phases() const { return phases_; }

    // The engine's side: runs `compute` (gf's computation on n_threads), timing kvlab's nodes
    // when a phase is set. n_tokens: the tokens the graph evaluates.
    void measure(ggml_cgraph * gf, int n_threads, int64_t n_tokens, const std::function<void()> & compute);

private:
    Phase & phase(int n_threads);
    std::string phase_;
    std::vector<Phase> phases_;
};

}  // namespace kvlab
