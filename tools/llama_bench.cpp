#include "llama_bench.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

std::string llama_bench_path() {
    if (const char * p = std::getenv("KVLAB_LLAMA_BENCH"); p && *p) return p;
#ifdef KVLAB_LLAMA_BENCH
    std::error_code ec;
    if (std::filesystem::exists(KVLAB_LLAMA_BENCH, ec)) return KVLAB_LLAMA_BENCH;
#endif
    return "";
}

std::vector<double> run_llama_bench(const std::string & model_path, const LlamaBenchRun & r) {
    const std::string exe = llama_bench_path();
    if (exe.empty()) throw Error("bench", "llama-bench is not built (scripts/deps.sh --bench builds it, once)");
    const std::string log =
        (std::filesystem::temp_directory_path() / ("kvlab-llama-bench-" + std::to_string(::getpid()) + ".log"))
            .string();
    // flash attention on, as the in-process libllama of kvlab bench
    const std::string cmd = shell_quote(exe) + " -m " + shell_quote(model_path) + " -p " + std::to_string(r.n_prompt) +
                            " -n " + std::to_string(r.n_gen) + " -d " + std::to_string(r.n_depth) + " -t " +
                            std::to_string(r.threads) + " -ub " + std::to_string(r.ubatch) + " -r " +
                            std::to_string(r.reps) + " -ctk " + shell_quote(r.cache_type_k) + " -ctv " +
                            shell_quote(r.cache_type_v) + " -fa on -o json 2>" + shell_quote(log);
    std::string out;
    {
        std::unique_ptr<FILE, int (*)(FILE *)> pipe(popen(cmd.c_str(), "r"), pclose);
        if (!pipe) throw Error("bench", "cannot run " + exe);
        char buf[4096];
        for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, n);
        const int status = pclose(pipe.release());
        if (status != 0) {
            std::string err;
            if (FILE * f = std::fopen(log.c_str(), "r")) {
                for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) err.append(buf, n);
                std::fclose(f);
            }
            std::remove(log.c_str());
            throw Error("bench",
                        "llama-bench failed (" + cmd + "): " + err.substr(err.size() > 2000 ? err.size() - 2000 : 0));
        }
    }
    std::remove(log.c_str());
    try {
        const nlohmann::json j = nlohmann::json::parse(out);
        if (!j.is_array() || j.size() != 1)
            throw Error("bench", "llama-bench printed " + std::to_string(j.size()) + " tests, expected 1");
        return j[0].at("samples_ts").get<std::vector<double>>();
    } catch (const nlohmann::json::exception & e) {
        throw Error("bench", std::string("cannot read llama-bench's JSON: ") + e.what());
    }
}

}  // namespace kvlab::cli
