// kvlab info MODEL [--json]: the provenance record of a model.
#include <cstdio>

#include "common.h"
#include "kvlab/cache.h"
#include "kvlab/provenance.h"

namespace kvlab::cli {

namespace {

const CommandRegistrar reg("info", [](CLI::App & app, int & rc) {
    auto * cmd =
        app.add_subcommand("info", "Print a model's provenance: file hashes, hyper-parameters, tokens, build, machine");
    auto model = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    auto threads = std::make_shared<int>(0);
    auto kernels = std::make_shared<KernelArgs>();
    add_model_arg(cmd, *model);
    add_json_flag(cmd, *json, "the record");
    add_threads_option(cmd, *threads)->description("threads recorded in the provenance");
    add_kernel_options(cmd, *kernels);
    cmd->callback([&rc, model, json, threads, kernels] {
        Loaded l = load(*model, kernels->options(*threads));
        const nlohmann::json p = provenance(*l.model, *l.tok);
        if (*json) {
            std::printf("%s\n", p.dump(2).c_str());
            rc = 0;
            return;
        }
        const auto & h = p["hparams"];
        const auto & m = p["model"];
        std::printf("model       %s\n", m["path"].get<std::string>().c_str());
        std::printf("size        %s (%llu bytes)\n", human_bytes(m["file_bytes"].get<uint64_t>()).c_str(),
                    static_cast<unsigned long long>(m["file_bytes"].get<uint64_t>()));
        std::printf("sha256      %s\n", m["sha256"].get<std::string>().c_str());
        std::printf("arch        %s: %d layers, %d heads (%d KV), head_dim %d, n_embd %d, n_ff %d, vocab %d\n",
                    h["arch"].get<std::string>().c_str(), h["n_layer"].get<int>(), h["n_head"].get<int>(),
                    h["n_head_kv"].get<int>(), h["head_dim"].get<int>(), h["n_embd"].get<int>(), h["n_ff"].get<int>(),
                    h["n_vocab"].get<int>());
        std::printf("context     %d tokens (trained); rope %s, theta %g, scaling %s\n", h["n_ctx_train"].get<int>(),
                    h["rope"]["mode"].get<std::string>().c_str(), h["rope"]["theta"].get<double>(),
                    h["rope"]["scaling"].get<std::string>().c_str());
        {  // the KV cache each layer kind holds (F16 K and V rows; kvlab::KvStore)
            const int64_t row = 2 * 2 * int64_t(h["head_dim"].get<int>()) * h["n_head_kv"].get<int>();
            const int n_layer = h["n_layer"].get<int>();
            if (h.contains("sliding_window") && h["sliding_window"].is_object()) {
                const auto & sw = h["sliding_window"];
                const int w = sw["n_swa"].get<int>(), n_sliding = int(sw["layers"].size());
                const int64_t most = int64_t(w) - 1 + KvStore::k_slide_rows - 1;
                std::string global;
                for (int il = 0, j = 0; il < n_layer; ++il) {
                    if (j < n_sliding && sw["layers"][size_t(j)].get<int>() == il) {
                        ++j;
                        continue;
                    }
                    global += (global.empty() ? "" : ", ") + std::to_string(il);
                }
                std::printf("attention   sliding window %d on %d of %d layers (global: %s), their rope theta %g\n", w,
                            n_sliding, n_layer, global.empty() ? "none" : global.c_str(),
                            sw["rope_theta"].get<double>());
                std::printf(
                    "kv cache    %lld B per token and layer; a sliding layer holds at most %lld rows "
                    "(%s in all %d, any context length); the %d global layers %s per 1k tokens\n",
                    static_cast<long long>(row), static_cast<long long>(most),
                    human_bytes(uint64_t(most * row * n_sliding)).c_str(), n_sliding, n_layer - n_sliding,
                    human_bytes(uint64_t(1024 * row * (n_layer - n_sliding))).c_str());
            } else {
                std::printf("kv cache    %lld B per token and layer, %s per 1k tokens (%d layers)\n",
                            static_cast<long long>(row), human_bytes(uint64_t(1024 * row * n_layer)).c_str(), n_layer);
            }
        }
        std::printf("tensors     ");
        for (const auto & [type, count] : m["gguf"]["tensor_type_counts"].items())
            std::printf("%s:%lld ", type.c_str(), static_cast<long long>(count.get<int64_t>()));
        std::printf("\n");
        std::printf("tokens      bos %d, eos %d, eot %d\n", p["tokens"]["bos"].get<int>(),
                    p["tokens"]["eos"].get<int>(), p["tokens"]["eot"].get<int>());
        std::printf("hashes      tokenizer %s\n            chat template %s\n            metadata %s\n",
                    m["gguf"]["tokenizer_sha256"].get<std::string>().c_str(),
                    m["gguf"]["chat_template_sha256"].is_string()
                        ? m["gguf"]["chat_template_sha256"].get<std::string>().c_str()
                        : "none (the GGUF has no tokenizer.chat_template)",
                    m["gguf"]["metadata_sha256"].get<std::string>().c_str());
        std::printf("build       kvlab %s (%s), ggml %s (%s)\n", p["build"]["kvlab_version"].get<std::string>().c_str(),
                    p["build"]["kvlab_git_commit"].get<std::string>().c_str(),
                    p["build"]["ggml_version"].get<std::string>().c_str(),
                    p["build"]["ggml_commit"].get<std::string>().c_str());
        std::printf("machine     %s, %s, %d threads\n", p["machine"]["backend"].get<std::string>().c_str(),
                    p["machine"]["cpu"].get<std::string>().c_str(), p["machine"]["threads"].get<int>());
        rc = 0;
    });
});

}  // namespace

}  // namespace kvlab::cli
