// kvlab info MODEL [--json]: the provenance record of a model.
#include <cstdio>

#include "common.h"
#include "kvlab/provenance.h"

namespace kvlab::cli {

namespace {

const CommandRegistrar reg("info", [](CLI::App & app, int & rc) {
    auto * cmd =
        app.add_subcommand("info", "Print a model's provenance: file hashes, hyper-parameters, tokens, build, machine");
    auto model = std::make_shared<std::string>();
    auto json = std::make_shared<bool>(false);
    auto threads = std::make_shared<int>(0);
    add_model_arg(cmd, *model);
    add_json_flag(cmd, *json, "the record");
    add_threads_option(cmd, *threads)->description("threads recorded in the provenance");
    cmd->callback([&rc, model, json, threads] {
        Loaded l = load(*model, *threads);
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
        std::printf("tensors     ");
        for (const auto & [type, count] : m["gguf"]["tensor_type_counts"].items())
            std::printf("%s:%lld ", type.c_str(), static_cast<long long>(count.get<int64_t>()));
        std::printf("\n");
        std::printf("tokens      bos %d, eos %d, eot %d\n", p["tokens"]["bos"].get<int>(),
                    p["tokens"]["eos"].get<int>(), p["tokens"]["eot"].get<int>());
        std::printf("hashes      tokenizer %s\n            chat template %s\n            metadata %s\n",
                    m["gguf"]["tokenizer_sha256"].get<std::string>().c_str(),
                    m["gguf"]["chat_template_sha256"].get<std::string>().c_str(),
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
