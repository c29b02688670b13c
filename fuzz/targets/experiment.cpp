// Fuzz target `experiment`: an experiment file (`kvlab eval EXPERIMENT.json`) through the
// checks `kvlab eval` makes before any work: the JSON itself, RunConfig::from_json, every
// method with its params and preset made against the tiny model, every budget.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "eval/runner.h"
#include "kvlab/error.h"
#include "kvlab/press.h"
#include "support/fixtures.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

void one(const uint8_t * data, size_t size) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(data, data + size);
    } catch (const nlohmann::json::exception &) {
        return;  // the CLI refuses text that is not JSON (or a number too big) as such (read_json_file)
    }
    try {
        const eval::RunConfig cfg = eval::RunConfig::from_json(j);
        for (const auto & m : cfg.methods)
            (void)make_press(m.name, apply_preset(cfg.preset, m.name, m.params), tiny_model());
        for (const auto & b : cfg.budgets) (void)b.budget();
        (void)cfg.to_json().dump();
    } catch (const Error &) {
    }
}

// The committed experiments (experiments/*.json) and the demo's own config (the header
// record of docs/results/demo-header.json).
void seeds(const std::string & dir) {
    for (const auto & e : std::filesystem::directory_iterator(test::source_dir() + "/experiments"))
        if (e.path().extension() == ".json")
            write_seed(dir, e.path().filename().string(), read_file(e.path().string()));
    const nlohmann::json header =
        nlohmann::json::parse(read_file(test::source_dir() + "/docs/results/demo-header.json"));
    if (header.contains("config")) write_seed(dir, "demo-config.json", header["config"].dump(2));
}

const FuzzRegistrar reg({"experiment", [] { (void)tiny_model(); }, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
