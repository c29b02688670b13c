// Deterministic instruction counts (callgrind) of one prefill and one decode step: the figure
// of `kvlab bench --instructions` that shows a regression on a noisy machine. valgrind cannot
// run AVX-512, so the counted kvlab is the x86-64-v3 build of scripts/build-callgrind.sh
// ($KVLAB_CALLGRIND_BIN overrides its path); it runs `kvlab count-instructions` under callgrind,
// which measures only between its client requests (the model's load is not counted).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace kvlab::cli {

struct InstructionRun {
    int n_prompt = 512;  // tokens of the counted prefill, then one decode step on top
    int chunk = 512;
    std::string attention = "kvlab";
};

struct InstructionCounts {
    uint64_t prefill = 0;      // instructions (callgrind's Ir) of the prefill, 1 thread
    uint64_t decode_step = 0;  // of one single-token evaluation after it
    std::string binary, valgrind;
};

// The counted build's kvlab, or "" when it is not built.
std::string callgrind_binary();

// Runs the counted build under callgrind on the GGUF at model_path (a few minutes). Throws
// kvlab::Error when valgrind or the build is missing, or the run fails.
InstructionCounts count_instructions(const std::string & model_path, const InstructionRun & r);

nlohmann::json to_json(const InstructionCounts & c, const InstructionRun & r);

}  // namespace kvlab::cli
