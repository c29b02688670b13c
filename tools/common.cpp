#include "common.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "kvlab/error.h"
#include "kvlab/registry.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

Loaded load(const std::string & name_or_path, int n_threads) {
    Loaded l;
    l.path = resolve_model(name_or_path);
    l.model = Model::load(l.path, n_threads);
    l.tok = std::make_unique<Tokenizer>(l.path);
    if (l.tok->n_vocab() != l.model->hparams().n_vocab)
        throw Error("model", l.path + ": the vocabulary (" + std::to_string(l.tok->n_vocab()) +
                                 " tokens) does not match the output layer (" +
                                 std::to_string(l.model->hparams().n_vocab) + ")");
    return l;
}

int default_threads() {
    return std::max(1, int(std::thread::hardware_concurrency()));
}

nlohmann::json memory_json(const Model & model, const KvStore * cache, const Engine * engine) {
    const MemInfo mi = mem_info();
    nlohmann::json j = {
        {"rss_bytes", mi.rss_bytes}, {"peak_rss_bytes", mi.peak_rss_bytes}, {"weight_bytes", model.weight_bytes()}};
    if (cache) {
        j["kv_allocated_bytes"] = cache->bytes();
        j["kv_used_bytes"] = cache->used_bytes();
    }
    if (engine) j["compute_bytes"] = engine->compute_bytes();
    return j;
}

void add_attention_option(CLI::App * cmd, std::string & value) {
    cmd->add_option("--attention", value,
                    "attention kernel: kvlab (float32 on any cache shape, chunk-size invariant) or ggml "
                    "(ggml's flash attention where a layer's heads are uniform: libllama's exact arithmetic)")
        ->capture_default_str()
        ->check(CLI::IsMember({"kvlab", "ggml"}));
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cli", "cannot read " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string human_bytes(uint64_t n) {
    char buf[64];
    if (n >= (1ull << 30))
        std::snprintf(buf, sizeof(buf), "%.2f GiB", double(n) / double(1ull << 30));
    else if (n >= (1ull << 20))
        std::snprintf(buf, sizeof(buf), "%.2f MiB", double(n) / double(1ull << 20));
    else if (n >= 1024)
        std::snprintf(buf, sizeof(buf), "%.1f KiB", double(n) / 1024.0);
    else
        std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(n));
    return buf;
}

}  // namespace kvlab::cli
