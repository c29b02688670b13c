#include "server/context_request.h"

#include <algorithm>

#include "kvlab/error.h"
#include "server/api_error.h"
#include "server/openai.h"

namespace kvlab::server {

ContextRequest parse_context_request(const nlohmann::json & b, CacheTypes default_types) {
    ContextRequest r;
    if (b.contains("messages")) {
        if (b.contains("text")) throw ApiError(400, "give 'text' or 'messages', not both", "messages");
        std::vector<ChatMessage> m = parse_messages(b["messages"], "messages");
        if (m.back().role != "user")
            throw ApiError(400, "the last message is the context: it must be a user message", "messages");
        r.text = m.back().content;
        m.pop_back();
        r.before = m;
    } else if (b.contains("text") && b["text"].is_string()) {
        r.text = b["text"];
        if (b.contains("system") && !b["system"].is_null()) {
            if (!b["system"].is_string()) throw ApiError(400, "'system' must be a string", "system");
            r.before.push_back({"system", b["system"]});
        }
    } else {
        throw ApiError(400, "give the context as 'text' (a string) or 'messages'", "text");
    }
    if (r.text.empty()) throw ApiError(400, "the context is empty", "text");
    for (const char * key : {"name", "method", "preset"})
        if (b.contains(key) && !b[key].is_null() && !b[key].is_string())
            throw ApiError(400, std::string("'") + key + "' must be a string", key);
    r.name = b.contains("name") && b["name"].is_string() ? b["name"].get<std::string>() : "";
    if (r.name.size() > k_max_name_bytes)
        throw ApiError(400, "'name' is longer than " + std::to_string(k_max_name_bytes) + " bytes", "name");
    r.method = b.contains("method") && b["method"].is_string() ? b["method"].get<std::string>() : "none";
    const std::vector<MethodInfo> methods = press_methods();
    if (r.method != "none" &&  // an unknown method is named before its budget is checked
        std::none_of(methods.begin(), methods.end(), [&](const MethodInfo & m) { return m.name == r.method; })) {
        std::string known = "none";
        for (const MethodInfo & m : methods) known += ", " + m.name;
        throw ApiError(400, "unknown method '" + r.method.substr(0, 64) + "' (methods: " + known + ")", "method",
                       "unknown_method");
    }
    r.preset = b.contains("preset") && b["preset"].is_string() ? b["preset"].get<std::string>() : "";
    if (!r.preset.empty() && r.preset != "kvpress") throw ApiError(400, "'preset' can only be \"kvpress\"", "preset");
    const auto given = [&b](const char * key) { return b.contains(key) && !b[key].is_null(); };
    const bool ratio = given("ratio"), tokens = given("budget"), kv_bytes = given("kv_bytes"),
               bytes_ratio = given("bytes_ratio");
    if (int(ratio) + int(tokens) + int(kv_bytes) + int(bytes_ratio) > 1)
        throw ApiError(400, "give one of 'ratio', 'budget', 'kv_bytes' and 'bytes_ratio'", "budget");
    if (ratio) {
        if (!b["ratio"].is_number() || b["ratio"].get<double>() < 0.0 || b["ratio"].get<double>() >= 1.0)
            throw ApiError(400, "'ratio' must be a number in [0, 1)", "ratio");
        r.budget = Budget::from_ratio(b["ratio"].get<double>());
        r.has_budget = true;
    }
    if (tokens) {
        if (!b["budget"].is_number_integer() || b["budget"].get<int64_t>() < 1)
            throw ApiError(400, "'budget' must be a positive integer (tokens kept per layer)", "budget");
        r.budget = Budget::from_tokens(b["budget"].get<int64_t>());
        r.has_budget = true;
    }
    if (kv_bytes) {
        if (!b["kv_bytes"].is_number_integer() || b["kv_bytes"].get<int64_t>() < 1)
            throw ApiError(400, "'kv_bytes' must be a positive integer (K/V bytes the rows may hold)", "kv_bytes");
        r.budget = Budget::from_bytes(b["kv_bytes"].get<int64_t>());
        r.has_budget = true;
    }
    if (bytes_ratio) {
        if (!b["bytes_ratio"].is_number() || !(b["bytes_ratio"].get<double>() > 0.0) ||
            b["bytes_ratio"].get<double>() > 1.0)
            throw ApiError(400, "'bytes_ratio' must be a number in (0, 1] (of the F16 full cache's bytes)",
                           "bytes_ratio");
        r.budget = Budget::from_bytes_ratio(b["bytes_ratio"].get<double>());
        r.has_budget = true;
    }
    if (given("demote") || given("high_share")) {
        if (!given("demote") || !b["demote"].is_string() || (b["demote"] != "q8_0" && b["demote"] != "q4_0"))
            throw ApiError(400, "'demote' must be \"q8_0\" or \"q4_0\" (the type of the rows kept instead of evicted)",
                           "demote");
        if (given("high_share") && (!b["high_share"].is_number() || b["high_share"].get<double>() < 0.0 ||
                                    b["high_share"].get<double>() > 1.0))
            throw ApiError(400, "'high_share' must be a number in [0, 1]", "high_share");
        r.budget.set_demotion(parse_cache_type(b["demote"].get<std::string>()),
                              given("high_share") ? b["high_share"].get<double>() : -1.0);
        r.demotes = true;
    }
    if (b.contains("compress_sliding") && !b["compress_sliding"].is_null()) {
        if (!b["compress_sliding"].is_boolean())
            throw ApiError(400, "'compress_sliding' must be true or false", "compress_sliding");
        r.budget.sliding = b["compress_sliding"].get<bool>();  // sliding-window layers (gemma3) too
    }
    if (r.method != "none" && !r.has_budget)
        throw ApiError(400, "method " + r.method + " needs 'ratio', 'budget', 'kv_bytes' or 'bytes_ratio'", "ratio");
    if (r.method == "none" && (r.has_budget || r.demotes))
        throw ApiError(400, "a budget ('ratio', 'budget', 'kv_bytes', 'bytes_ratio', 'demote') needs a 'method'",
                       "method");
    if (b.contains("params") && !b["params"].is_null()) {
        if (!b["params"].is_object()) throw ApiError(400, "'params' must be an object", "params");
        for (const auto & [k, v] : b["params"].items()) {
            if (v.is_string())
                r.params[k] = v.get<std::string>();
            else if (v.is_number() || v.is_boolean())
                r.params[k] = v.dump();
            else
                throw ApiError(400, "'params." + k + "' must be a string, number or boolean", "params");
        }
    }
    if (b.contains("cache_type_k") || b.contains("cache_type_v") || b.contains("kv_rotation")) {
        CacheTypes t = default_types;
        if (b.contains("kv_rotation") && !b["kv_rotation"].is_null()) {
            if (!b["kv_rotation"].is_boolean()) throw ApiError(400, "'kv_rotation' must be a boolean", "kv_rotation");
            t.rotate = b["kv_rotation"].get<bool>();
        }
        for (const char * key : {"cache_type_k", "cache_type_v"}) {
            if (!b.contains(key) || b[key].is_null()) continue;
            const std::string k = key;
            if (!b[key].is_string()) throw ApiError(400, "'" + k + "' must be a string: f16, q8_0 or q4_0", k);
            try {
                (k == "cache_type_k" ? t.k : t.v) = parse_cache_type(b[key].get<std::string>());
            } catch (const Error & e) {
                throw ApiError(400, e.what(), k);
            }
        }
        r.cache_types = t;
    }
    const CacheTypes t = r.cache_types.value_or(default_types);
    // per block of 32 values: the types' order is the same at every head_dim they allow
    if (r.demotes && !demotion_saves(t.k, t.v, r.budget.demote, 32))
        throw ApiError(400,
                       std::string("demoting to ") + cache_type_name(r.budget.demote) +
                           " frees nothing in a cache of " + cache_type_name(t.k) + " K / " + cache_type_name(t.v) +
                           " V rows: demote to a type smaller than both",
                       "demote");
    return r;
}

}  // namespace kvlab::server
