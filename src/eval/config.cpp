// The experiment: RunConfig to and from JSON (the `config` of a header record), budgets.
#include <set>
#include <sstream>

#include "eval/runner.h"
#include "kvlab/error.h"

namespace kvlab::eval {

std::string BudgetConfig::label() const {
    std::ostringstream o;
    if (tokens >= 0)
        o << "budget " << tokens;
    else
        o << "ratio " << ratio;
    return o.str();
}

Budget BudgetConfig::budget() const {
    return tokens >= 0 ? Budget::from_tokens(tokens) : Budget::from_ratio(ratio);
}

nlohmann::json RunConfig::to_json() const {
    nlohmann::json methods_j = nlohmann::json::array(), budgets_j = nlohmann::json::array();
    for (const auto & m : methods) methods_j.push_back({{"name", m.name}, {"params", m.params}});
    for (const auto & b : budgets)
        budgets_j.push_back(b.tokens >= 0 ? nlohmann::json{{"tokens", b.tokens}} : nlohmann::json{{"ratio", b.ratio}});
    return {{"model", model},
            {"tasks", tasks},
            {"lengths", task.lengths},
            {"depths", task.depths},
            {"samples", task.n_samples},
            {"seed", task.seed},
            {"haystack", haystack},
            {"methods", methods_j},
            {"preset", preset},
            {"budgets", budgets_j},
            {"query_aware", query_aware},
            {"multi_turn", multi_turn},
            {"max_tokens", max_tokens},
            {"threads", threads},
            {"chunk", chunk},
            {"attention", attention},
            {"out_dir", out_dir},
            {"shard", shard},
            {"n_shards", n_shards}};
}

RunConfig RunConfig::from_json(const nlohmann::json & j) {
    if (!j.is_object()) throw Error("eval", "an experiment is a JSON object");
    static const std::set<std::string> known = {
        "model",       "preset",     "tasks",      "lengths", "depths", "samples",   "seed",    "haystack", "methods", "budgets",
        "query_aware", "multi_turn", "max_tokens", "threads", "chunk",  "attention", "out_dir", "shard",    "n_shards"};
    for (const auto & [k, v] : j.items())
        if (!known.count(k)) throw Error("eval", "unknown experiment key '" + k + "'");
    RunConfig c;
    try {
        if (j.contains("model")) c.model = j["model"].get<std::string>();
        if (j.contains("tasks")) c.tasks = j["tasks"].get<std::vector<std::string>>();
        if (j.contains("lengths")) c.task.lengths = j["lengths"].get<std::vector<int64_t>>();
        if (j.contains("depths")) c.task.depths = j["depths"].get<std::vector<double>>();
        if (j.contains("samples")) c.task.n_samples = j["samples"].get<int>();
        if (j.contains("seed")) c.task.seed = j["seed"].get<uint64_t>();
        if (j.contains("haystack")) c.haystack = j["haystack"].get<std::vector<std::string>>();
        if (j.contains("methods"))
            for (const auto & m : j["methods"]) {
                MethodConfig mc;
                if (m.is_string()) {
                    mc.name = m.get<std::string>();
                } else {
                    mc.name = m.at("name").get<std::string>();
                    if (m.contains("params"))
                        for (const auto & [k, v] : m["params"].items())
                            mc.params[k] = v.is_string() ? v.get<std::string>() : v.dump();
                }
                c.methods.push_back(mc);
            }
        if (j.contains("budgets"))
            for (const auto & b : j["budgets"]) {
                BudgetConfig bc;
                if (b.is_number())
                    bc.ratio = b.get<double>();
                else if (b.contains("tokens"))
                    bc.tokens = b["tokens"].get<int64_t>();
                else
                    bc.ratio = b.at("ratio").get<double>();
                c.budgets.push_back(bc);
            }
        if (j.contains("query_aware")) c.query_aware = j["query_aware"].get<bool>();
        if (j.contains("multi_turn")) c.multi_turn = j["multi_turn"].get<bool>();
        if (j.contains("preset")) c.preset = j["preset"].get<std::string>();
        if (j.contains("max_tokens")) c.max_tokens = j["max_tokens"].get<int>();
        if (j.contains("threads")) c.threads = j["threads"].get<int>();
        if (j.contains("chunk")) c.chunk = j["chunk"].get<int>();
        if (j.contains("attention")) c.attention = j["attention"].get<std::string>();
        if (j.contains("out_dir")) c.out_dir = j["out_dir"].get<std::string>();
        if (j.contains("shard")) c.shard = j["shard"].get<int>();
        if (j.contains("n_shards")) c.n_shards = j["n_shards"].get<int>();
    } catch (const nlohmann::json::exception & e) {
        throw Error("eval", std::string("malformed experiment: ") + e.what());
    }
    return c;
}

}  // namespace kvlab::eval
