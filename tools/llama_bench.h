// llama.cpp's own llama-bench, run as a separate process on the same GGUF and threads: the
// anchor beside in-process libllama in `kvlab bench`. Built by scripts/deps.sh into the
// dependency prefix ($KVLAB_LLAMA_BENCH overrides the path).
#pragma once

#include <string>
#include <vector>

namespace kvlab::cli {

struct LlamaBenchRun {
    int n_prompt = 0;  // -p: prompt tokens timed
    int n_gen = 0;     // -n: generated tokens timed
    int n_depth = 0;   // -d: context already in the cache (untimed)
    int threads = 1, ubatch = 512, reps = 3;
    std::string cache_type_k = "f16", cache_type_v = "f16";  // -ctk, -ctv
};

// The llama-bench executable, or "" when it is not built.
std::string llama_bench_path();

// Tokens per second of each repetition (llama-bench's samples_ts). Throws kvlab::Error with
// llama-bench's own message when it fails.
std::vector<double> run_llama_bench(const std::string & model_path, const LlamaBenchRun & r);

}  // namespace kvlab::cli
