// Shared helpers of the test suite: paths of test inputs and comparison of logits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab::test {

// The project root (KVLAB_SOURCE_DIR, set by CTest; else the current directory).
std::string source_dir();
// Contents of tests/data/NAME.
std::string test_text(const std::string & name);
// A fresh temporary directory for one test.
std::string temp_dir(const std::string & tag);
// The kvlab executable (KVLAB_BINARY, set by CTest).
std::string kvlab_binary();

struct LogitDiff {
    float max_abs = 0.0f;       // max |a - b| over every row and token
    int64_t top1_mismatch = 0;  // rows whose argmax differ
    int64_t first_mismatch = -1;
};
// a, b: row-major [n_rows][n_vocab].
LogitDiff compare_logits(const std::vector<float> & a, const std::vector<float> & b, int64_t n_vocab);

struct RunResult {
    int exit_code = 0;
    std::string output;  // stdout and stderr together
};
RunResult run_command(const std::string & cmd);

}  // namespace kvlab::test
