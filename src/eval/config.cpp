// The experiment: RunConfig to and from JSON (the `config` of a header record), budgets.
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

#include "eval/runner.h"
#include "kvlab/cache.h"
#include "kvlab/error.h"

namespace kvlab::eval {

std::string BudgetConfig::label() const {
    std::ostringstream o;
    if (b.kv_bytes >= 0)
        o << "kv_bytes " << b.kv_bytes;
    else if (b.bytes_ratio > 0.0)
        o << "bytes " << b.bytes_ratio;
    else if (b.tokens >= 0)
        o << "budget " << b.tokens;
    else
        o << "ratio " << b.ratio;
    if (b.demotes()) {
        o << " demote " << cache_type_name(b.demote);
        if (b.high_share >= 0.0) o << " share " << b.high_share;
    }
    return o.str();
}

std::string types_label(ggml_type k, ggml_type v) {
    return k == v ? cache_type_name(k) : std::string(cache_type_name(k)) + "/" + cache_type_name(v);
}

std::pair<ggml_type, ggml_type> parse_types(const std::string & label) {
    const size_t slash = label.find('/');
    if (slash == std::string::npos) return {parse_cache_type(label), parse_cache_type(label)};
    return {parse_cache_type(label.substr(0, slash)), parse_cache_type(label.substr(slash + 1))};
}

std::vector<std::string> RunConfig::cache_type_axis() const {
    if (!cache_types.empty()) return cache_types;
    return {types_label(parse_cache_type(cache_type_k), parse_cache_type(cache_type_v))};
}

nlohmann::json RunConfig::to_json() const {
    nlohmann::json methods_j = nlohmann::json::array(), budgets_j = nlohmann::json::array();
    for (const auto & m : methods) methods_j.push_back({{"name", m.name}, {"params", m.params}});
    for (const auto & b : budgets) budgets_j.push_back(b.budget().to_json());
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
            {"long_tokens", task.long_tokens},
            {"decode_policy",
             {{"method", decode.method},
              {"interval", decode.interval},
              {"target", decode.target},
              {"n_sink", decode.n_sink},
              {"window", decode.window},
              {"params", decode.params}}},
            {"threads", threads},
            {"products", products},
            {"repack", repack},
            {"chunk", chunk},
            {"attention", attention},
            {"cache_type_k", cache_type_k},
            {"cache_type_v", cache_type_v},
            {"kv_rotation", kv_rotation},
            {"cache_types", cache_types},
            {"out_dir", out_dir},
            {"shard", shard},
            {"n_shards", n_shards}};
}

namespace {

// A whole number of type T: a JSON integer within T's range (a float, or an integer T cannot
// hold, is refused by name rather than converted: 2.7e126 into an int is undefined).
template <typename T>
T whole(const nlohmann::json & v, const std::string & key) {
    constexpr uint64_t max = uint64_t(std::numeric_limits<T>::max());
    if (v.is_number_unsigned() && v.get<uint64_t>() <= max) return T(v.get<uint64_t>());
    if (v.is_number_integer() && !v.is_number_unsigned()) {
        const int64_t i = v.get<int64_t>();
        if (i >= 0 ? uint64_t(i) <= max : std::is_signed_v<T> && i >= int64_t(std::numeric_limits<T>::min()))
            return T(i);
    }
    throw Error("eval", "experiment key '" + key + "' must be a whole number in [" +
                            std::to_string(std::numeric_limits<T>::min()) + ", " + std::to_string(max) + "], got " +
                            v.dump());
}

template <typename T>
std::vector<T> wholes(const nlohmann::json & v, const std::string & key) {
    if (!v.is_array()) throw Error("eval", "experiment key '" + key + "' must be a list of whole numbers");
    std::vector<T> out;
    for (const auto & x : v) out.push_back(whole<T>(x, key));
    return out;
}

}  // namespace

RunConfig RunConfig::from_json(const nlohmann::json & j) {
    if (!j.is_object()) throw Error("eval", "an experiment is a JSON object");
    static const std::set<std::string> known = {
        "model",        "preset",       "tasks",       "lengths",     "depths",      "samples",      "seed",
        "haystack",     "methods",      "budgets",     "query_aware", "multi_turn",  "max_tokens",   "threads",
        "products",     "repack",       "chunk",       "attention",   "out_dir",     "shard",        "n_shards",
        "cache_type_k", "cache_type_v", "kv_rotation", "cache_types", "long_tokens", "decode_policy"};
    for (const auto & [k, v] : j.items())
        if (!known.count(k)) throw Error("eval", "unknown experiment key '" + k + "'");
    RunConfig c;
    try {
        if (j.contains("model")) c.model = j["model"].get<std::string>();
        if (j.contains("tasks")) c.tasks = j["tasks"].get<std::vector<std::string>>();
        if (j.contains("lengths")) c.task.lengths = wholes<int64_t>(j["lengths"], "lengths");
        if (j.contains("depths")) c.task.depths = j["depths"].get<std::vector<double>>();
        if (j.contains("samples")) c.task.n_samples = whole<int>(j["samples"], "samples");
        if (j.contains("seed")) c.task.seed = whole<uint64_t>(j["seed"], "seed");
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
                if (b.contains("sliding"))
                    throw Error("eval", "experiment budgets do not take 'sliding' (a run-wide choice)");
                c.budgets.push_back({Budget::from_json(b)});  // a number (a ratio) or a budget object
            }
        if (j.contains("query_aware")) c.query_aware = j["query_aware"].get<bool>();
        if (j.contains("multi_turn")) c.multi_turn = j["multi_turn"].get<bool>();
        if (j.contains("preset")) c.preset = j["preset"].get<std::string>();
        if (j.contains("max_tokens")) c.max_tokens = whole<int>(j["max_tokens"], "max_tokens");
        if (j.contains("long_tokens")) c.task.long_tokens = whole<int64_t>(j["long_tokens"], "long_tokens");
        if (j.contains("decode_policy")) {
            const nlohmann::json & d = j["decode_policy"];
            if (!d.is_object()) throw Error("eval", "experiment key 'decode_policy' must be an object");
            for (const auto & [k, v] : d.items()) {
                if (k == "method")
                    c.decode.method = v.get<std::string>();
                else if (k == "interval")
                    c.decode.interval = whole<int64_t>(v, "decode_policy.interval");
                else if (k == "target")
                    c.decode.target = whole<int64_t>(v, "decode_policy.target");
                else if (k == "n_sink")
                    c.decode.n_sink = whole<int64_t>(v, "decode_policy.n_sink");
                else if (k == "window")
                    c.decode.window = whole<int64_t>(v, "decode_policy.window");
                else if (k == "params")
                    for (const auto & [pk, pv] : v.items())
                        c.decode.params[pk] = pv.is_string() ? pv.get<std::string>() : pv.dump();
                else
                    throw Error("eval", "unknown key 'decode_policy." + k + "'");
            }
        }
        if (j.contains("threads")) c.threads = whole<int>(j["threads"], "threads");
        if (j.contains("products")) c.products = j["products"].get<std::string>();
        if (j.contains("repack")) c.repack = j["repack"].get<bool>();
        if (j.contains("chunk")) c.chunk = whole<int>(j["chunk"], "chunk");
        if (j.contains("attention")) c.attention = j["attention"].get<std::string>();
        for (const char * key : {"cache_type_k", "cache_type_v"})
            if (j.contains(key)) {
                std::string & t = std::string(key) == "cache_type_k" ? c.cache_type_k : c.cache_type_v;
                t = j[key].get<std::string>();
                parse_cache_type(t);  // an unknown type is refused here, naming the choices
            }
        if (j.contains("kv_rotation")) c.kv_rotation = j["kv_rotation"].get<bool>();
        if (j.contains("cache_types")) {
            c.cache_types = j["cache_types"].get<std::vector<std::string>>();
            for (const std::string & t : c.cache_types) parse_types(t);  // refused here, naming the choices
        }
        if (j.contains("out_dir")) c.out_dir = j["out_dir"].get<std::string>();
        if (j.contains("shard")) c.shard = whole<int>(j["shard"], "shard");
        if (j.contains("n_shards")) c.n_shards = whole<int>(j["n_shards"], "n_shards");
    } catch (const nlohmann::json::exception & e) {
        throw Error("eval", std::string("malformed experiment: ") + e.what());
    }
    return c;
}

}  // namespace kvlab::eval
