#include "support/fixtures.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "environment.h"
#include "kvlab/log.h"
#include "kvlab/model.h"

namespace kvlab::test {

namespace {
// ggml and libllama quiet but for errors, as in the kvlab binary ($KVLAB_VERBOSE=1: everything).
const bool k_backend_logging = (set_backend_logging(cli::environment().verbose), true);
}  // namespace

std::string source_dir() {
    const char * s = std::getenv("KVLAB_SOURCE_DIR");
    return s ? s : std::filesystem::current_path().string();
}

std::string test_text(const std::string & name) {
    const std::string path = source_dir() + "/tests/data/" + name;
    std::ifstream in(path);
    if (!in) throw std::runtime_error("missing test data " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string temp_dir(const std::string & tag) {
    std::random_device rd;
    auto dir = std::filesystem::temp_directory_path() / ("kvlab-test-" + tag + "-" + std::to_string(rd()));
    std::filesystem::create_directories(dir);
    return dir.string();
}

std::string kvlab_binary() {
    const char * s = std::getenv("KVLAB_BINARY");
    return s ? s : source_dir() + "/build/kvlab";
}

LogitDiff compare_logits(const std::vector<float> & a, const std::vector<float> & b, int64_t n_vocab) {
    if (a.size() != b.size() || a.size() % n_vocab != 0) throw std::runtime_error("logit shapes differ");
    LogitDiff d;
    const int64_t n_rows = int64_t(a.size()) / n_vocab;
    for (int64_t r = 0; r < n_rows; ++r) {
        const float * x = a.data() + r * n_vocab;
        const float * y = b.data() + r * n_vocab;
        for (int64_t i = 0; i < n_vocab; ++i) d.max_abs = std::max(d.max_abs, std::fabs(x[i] - y[i]));
        if (std::max_element(x, x + n_vocab) - x != std::max_element(y, y + n_vocab) - y) {
            if (d.first_mismatch < 0) d.first_mismatch = r;
            ++d.top1_mismatch;
        }
    }
    return d;
}

RunResult run_command(const std::string & cmd) {
    RunResult r;
    std::FILE * p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) throw std::runtime_error("popen failed for " + cmd);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
    const int st = pclose(p);
    r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return r;
}

}  // namespace kvlab::test
