#include "instructions.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

namespace {

std::string run_capture(const std::string & cmd) {
    std::string out;
    std::unique_ptr<FILE, int (*)(FILE *)> pipe(popen(cmd.c_str(), "r"), pclose);
    if (!pipe) return out;
    char buf[256];
    while (std::fgets(buf, sizeof buf, pipe.get())) out += buf;
    return out;
}

// callgrind's total Ir in one dump file whose description names the trigger, or 0.
uint64_t dump_total(const std::filesystem::path & file, const std::string & trigger) {
    std::ifstream in(file);
    std::string line;
    bool ours = false;
    uint64_t total = 0;
    while (std::getline(in, line)) {
        if (line.rfind("desc: Trigger:", 0) == 0) ours = line.find(trigger) != std::string::npos;
        if (line.rfind("totals:", 0) == 0 || (total == 0 && line.rfind("summary:", 0) == 0))
            total = std::strtoull(line.c_str() + line.find(':') + 1, nullptr, 10);
    }
    return ours ? total : 0;
}

}  // namespace

std::string callgrind_binary() {
    if (const char * p = std::getenv("KVLAB_CALLGRIND_BIN"); p && *p) return p;
#ifdef KVLAB_SOURCE_DIR
    const std::string p = std::string(KVLAB_SOURCE_DIR) + "/build-callgrind/kvlab";
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) return p;
#endif
    return "";
}

InstructionCounts count_instructions(const std::string & model_path, const InstructionRun & r) {
    InstructionCounts c;
    c.binary = callgrind_binary();
    if (c.binary.empty())
        throw Error("bench", "--instructions needs the x86-64-v3 build that valgrind runs: scripts/build-callgrind.sh");
    c.valgrind = run_capture("valgrind --version 2>/dev/null");
    while (!c.valgrind.empty() && (c.valgrind.back() == '\n' || c.valgrind.back() == '\r')) c.valgrind.pop_back();
    if (c.valgrind.empty()) throw Error("bench", "--instructions needs valgrind (apt-get install valgrind)");
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("kvlab-callgrind-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    struct Cleanup {
        std::filesystem::path d;
        ~Cleanup() {
            std::error_code ec;
            std::filesystem::remove_all(d, ec);
        }
    } cleanup{dir};
    const std::string log = (dir / "log").string();
    const std::string cmd =
        "valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=" + shell_quote((dir / "cg.out").string()) +
        " " + shell_quote(c.binary) + " count-instructions " + shell_quote(model_path) + " --tokens " +
        std::to_string(r.n_prompt) + " --chunk " + std::to_string(r.chunk) + " --attention " +
        shell_quote(r.attention) + " >" + shell_quote(log) + " 2>&1";
    const int rc = std::system(cmd.c_str());
    for (const auto & e : std::filesystem::directory_iterator(dir)) {
        if (const uint64_t n = dump_total(e.path(), "kvlab-prefill")) c.prefill = n;
        if (const uint64_t n = dump_total(e.path(), "kvlab-decode-step")) c.decode_step = n;
    }
    if (rc != 0 || c.prefill == 0 || c.decode_step == 0) {
        std::ifstream in(log);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
        throw Error("bench", "the callgrind run failed (exit " + std::to_string(rc) + "):\n" + text);
    }
    return c;
}

nlohmann::json to_json(const InstructionCounts & c, const InstructionRun & r) {
    return {{"prefill_tokens", r.n_prompt},
            {"prefill", c.prefill},
            {"decode_step_at", r.n_prompt},
            {"decode_step", c.decode_step},
            {"threads", 1},
            {"chunk_size", r.chunk},
            {"attention", r.attention},
            {"counter", "callgrind Ir (instructions executed), between client requests; the model's load excluded"},
            {"build", "x86-64-v3 (AVX2): valgrind cannot run AVX-512, so not the native build's instructions"},
            {"binary", c.binary},
            {"valgrind", c.valgrind}};
}

}  // namespace kvlab::cli
