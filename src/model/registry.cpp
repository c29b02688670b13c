// The model table (data/models.json, embedded at build time; scripts/models.sh reads the same
// file). The pip fetcher is the front ends' (src/app/fetch.cpp).
#include "kvlab/registry.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kvlab/error.h"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

// data/models.json, embedded by the build (model_table.inc defines k_model_table_json).
#include "model_table.inc"

std::vector<ModelEntry> build_table() {
    std::vector<ModelEntry> t;
    const nlohmann::json j = nlohmann::json::parse(k_model_table_json);
    for (const auto & m : j.at("models")) {
        ModelEntry e;
        e.short_name = m.at("name");
        e.version = m.at("version");
        e.arch = m.at("arch");
        e.quant = m.at("quant");
        e.description = m.at("description");
        const auto packages = m.at("packages").get<std::vector<std::string>>();
        KVLAB_ASSERT(!packages.empty(), "a model comes in at least one package");
        e.package = packages[0];
        e.extra_packages.assign(packages.begin() + 1, packages.end());
        e.relpaths = m.at("files").get<std::vector<std::string>>();
        e.sha256 = m.at("sha256");
        e.size_bytes = m.at("bytes");
        t.push_back(std::move(e));
    }
    return t;
}

}  // namespace

std::string known_model_names() {
    std::string s;
    for (const auto & e : model_table()) s += (s.empty() ? "" : ", ") + e.short_name;
    return s;
}

const std::vector<ModelEntry> & model_table() {
    static const std::vector<ModelEntry> table = build_table();
    return table;
}

const ModelEntry * find_model(const std::string & short_name) {
    for (const auto & e : model_table()) {
        if (e.short_name == short_name) return &e;
    }
    return nullptr;
}

std::string cached_model_path(const ModelStore & store, const ModelEntry & e) {
    if (store.dir.empty()) throw Error("model", "no model cache folder was given");
    return (fs::path(store.dir) / (e.short_name + "-" + e.version + ".gguf")).string();
}

}  // namespace kvlab
