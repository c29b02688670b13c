// kvlab methods [--json]: the compression methods with their parameters and defaults.
#include <cstdio>

#include "common.h"
#include "kvlab/press.h"

namespace kvlab::cli {

namespace {
int run_methods(bool json) {
    const auto methods = press_methods();
    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const MethodInfo & m : methods) j.push_back(m.to_json());
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf(
        "Compression methods (--method NAME --param KEY=VALUE [--preset kvpress]; budget: --ratio R or "
        "--budget B)\n\n");
    for (const MethodInfo & m : methods) {
        std::printf("%-20s %s%s%s\n", m.name.c_str(), m.summary.c_str(),
                    m.observes ? " [scores from the prefill's queries]" : "",
                    m.decodes ? " [scores while decoding: --decode-policy]" : "");
        if (m.wrapper)
            std::printf("    %-18s %-8s %s\n", "base", "snapkv",
                        "the scorer it wraps (any method but the wrappers); the base's parameters apply too");
        for (const ParamSpec & p : m.params)
            std::printf("    %-18s %-8s %s\n", p.name.c_str(), p.def.c_str(), p.help.c_str());
        std::string preset;
        for (const auto & [k, v] : m.kvpress_params) preset += (preset.empty() ? "" : " ") + k + "=" + v;
        std::printf("    --preset kvpress: %s%s\n", preset.empty() ? "the defaults" : preset.c_str(),
                    m.kvpress_differs.empty() ? "" : ("; still differs: " + m.kvpress_differs).c_str());
        if (!m.defaults_differ.empty()) std::printf("    kvlab's defaults: %s\n", m.defaults_differ.c_str());
    }
    std::printf("\n%-20s %s\n", "none", "no compression: answers from the full cache");
    return 0;
}
const CommandRegistrar reg("methods", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand("methods", "List the KV-cache compression methods, their parameters and defaults");
    auto json = std::make_shared<bool>(false);
    add_json_flag(cmd, *json, "the list");
    cmd->callback([&rc, json] { rc = run_methods(*json); });
});
}  // namespace

}  // namespace kvlab::cli
