#include "common.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "environment.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::cli {

Loaded load(const std::string & name_or_path, const ModelOptions & opts) {
    return app::load(name_or_path, opts, environment().models);
}

ModelOptions KernelArgs::options(int n_threads) const {
    return app::KernelArgs::options(n_threads, environment().cache_dir);
}

void add_kernel_options(CLI::App * cmd, KernelArgs & k) {
    cmd->add_option("--products", k.products,
                    "arithmetic of the Q4_1, Q5_0 and Q8_0 weight products: ggml (bit-identical to ggml's mul_mat and "
                    "libllama's logits), amx (kvlab's block order on Intel AMX tiles, the same bits at every batch "
                    "size; a few float ulps from ggml's; with the weights in panels, Q4_K and Q6_K too), vnni (the "
                    "same block order and bits on AVX-512 VNNI, for "
                    "CPUs without AMX such as AMD Zen 4/5), auto (amx where the CPU and the kernel have AMX-INT8, "
                    "else vnni where the CPU has AVX-512 VNNI and BITALG, else ggml)")
        ->check(CLI::IsMember({"auto", "ggml", "amx", "vnni"}));
    cmd->add_flag("--no-repack", k.no_repack,
                  "keep every weight matrix in its GGUF layout (by default, under amx and vnni, kvlab packs the "
                  "matrices its block order reads into 16-row panels, and those ggml's CPU backend can repack "
                  "into a faster layout go there, as libllama places them)");
}

CLI::Option * add_model_arg(CLI::App * cmd, std::string & model, bool required) {
    CLI::Option * o = cmd->add_option("MODEL", model, "short name (`kvlab models`) or .gguf path");
    return required ? o->required() : o;
}

CLI::Option * add_threads_option(CLI::App * cmd, int & threads) {
    return cmd
        ->add_option("-t,--threads", threads,
                     "CPU threads; 0: every CPU that other processes leave idle (sampled for 0.1 s at start, then "
                     "again every quarter second while computing)")
        ->check(CLI::NonNegativeNumber);
}

CLI::Option * add_chunk_option(CLI::App * cmd, int & chunk) {
    return cmd->add_option("--chunk,--ubatch-size", chunk, "prefill chunk (ubatch) size in tokens")
        ->check(CLI::PositiveNumber);
}

CLI::Option * add_attention_option(CLI::App * cmd, std::string & value) {
    return cmd
        ->add_option("--attention", value,
                     "attention kernel: kvlab (float32 on any cache shape, chunk-size invariant) or ggml "
                     "(ggml's flash attention where a layer's heads are uniform: libllama's exact arithmetic)")
        ->check(CLI::IsMember({"kvlab", "ggml"}));
}

void add_run_options(CLI::App * cmd, int & threads, KernelArgs & k, EngineArgs & e) {
    add_threads_option(cmd, threads);
    add_kernel_options(cmd, k);
    add_engine_options(cmd, e);
}

void add_engine_options(CLI::App * cmd, EngineArgs & e) {
    add_chunk_option(cmd, e.chunk);
    add_attention_option(cmd, e.attention);
    const auto types = CLI::IsMember({"f16", "q8_0", "q4_0"});
    cmd->add_option("--cache-type-k", e.cache_type_k,
                    "(-ctk) KV cache type of K rows: f16, q8_0 or q4_0 (ggml's blocks, quantized as written)")
        ->check(types)
        ->capture_default_str();
    cmd->add_option("--cache-type-v", e.cache_type_v, "(-ctv) KV cache type of V rows: f16, q8_0 or q4_0")
        ->check(types)
        ->capture_default_str();
    cmd->add_flag("--no-kv-rotation", e.no_kv_rotation,
                  "store quantized K/V rows as they are, without the Walsh-Hadamard rotation llama.cpp applies "
                  "(as its LLAMA_ATTN_ROT_DISABLE=1)");
}

void add_decode_policy_options(CLI::App * cmd, DecodeArgs & d) {
    std::string methods;  // the registry's: every method that scores while decoding
    for (const std::string & m : decode_policy_methods()) methods += (methods.empty() ? "" : ", ") + m;
    cmd->add_option("--decode-policy", d.o.method,
                    "compression while decoding: " + methods +
                        ". Every --decode-interval generated tokens, each (layer, KV head) down to --decode-target "
                        "rows by the method's scores, or by its own threshold (kvzap: generated rows whose "
                        "predicted score is below --decode-param threshold=T dropped); docs/methods.md")
        ->capture_default_str()
        ->check(CLI::IsMember(decode_policy_methods()));
    cmd->add_option("--decode-interval", d.o.interval, "generated tokens between compressions while decoding")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--decode-target", d.o.target, "rows per (layer, KV head) after each compression while decoding")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--decode-param", d.params, "kvzap's KEY=VALUE while decoding (threshold, window, scorer, kind)");
}

CLI::Option * add_json_flag(CLI::App * cmd, bool & json, const std::string & what) {
    return cmd->add_flag("--json", json, "print " + what + " as one JSON object on stdout");
}

void add_budget_options(CLI::App * cmd, BudgetArgs & b) {
    auto * g = cmd->add_option_group("budget", "with a method, at most one of");
    g->add_option("--ratio", b.ratio, "compression ratio: fraction of the context's KV pairs removed, in [0, 1)")
        ->default_str("");
    g->add_option("--budget", b.tokens, "tokens kept per layer, observation window included")->default_str("");
    g->add_option("--kv-bytes", b.kv_bytes,
                  "K/V bytes the compressed cache's rows may hold (the method's ranking decides which rows stay, "
                  "are demoted (--demote) or go)")
        ->default_str("");
    g->add_option("--bytes-ratio", b.bytes_ratio,
                  "the same as a share in (0, 1] of the context's full cache at F16 (0.25: a quarter of its bytes)")
        ->default_str("");
    g->require_option(0, 1);
    cmd->add_option("--demote", b.demote,
                    "keep the rows the budget would evict at this lower type instead (q8_0 or q4_0; mixed precision)")
        ->check(CLI::IsMember({"q8_0", "q4_0"}));
    cmd->add_option("--high-share", b.high_share,
                    "with --demote and a byte budget: the share of its bytes held at the cache types (1: eviction "
                    "only, 0: every kept row demoted; default: keep every row if the bytes allow, as many as fit at "
                    "the cache types)")
        ->check(CLI::Range(0.0, 1.0))
        ->default_str("");
    cmd->add_flag("--compress-sliding", b.sliding,
                  "models with sliding-window layers (gemma3): the method compresses those layers too, inside their "
                  "window (by default it compresses the global layers and each sliding layer keeps its window)");
}

CLI::Option * add_param_option(CLI::App * cmd, std::vector<std::string> & params, bool per_method) {
    return cmd->add_option("--param", params,
                           per_method ? "method parameter METHOD:KEY=VALUE, or KEY=VALUE when one method runs "
                                        "(repeatable; see `kvlab methods`)"
                                      : "method parameter KEY=VALUE (repeatable; see `kvlab methods`)");
}

CLI::Option * add_preset_option(CLI::App * cmd, std::string & preset) {
    return cmd
        ->add_option("--preset", preset,
                     "kvpress: every method takes the parameters that follow kvpress's rules (see `kvlab methods`; "
                     "--param overrides them)")
        ->check(CLI::IsMember({"", "kvpress"}));
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

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cli", "cannot read " + path + ": " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw Error("cli", "error reading " + path);
    return ss.str();
}

nlohmann::json read_json_file(const std::string & path) {
    try {
        return nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception & e) {
        throw Error("cli", path + ": not valid JSON: " + e.what());
    }
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
