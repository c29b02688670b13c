#include "app/options.h"

#include <algorithm>

#include "kvlab/error.h"

namespace kvlab::app {

ModelOptions KernelArgs::options(int n_threads, const std::string & hash_cache_dir) const {
    return {.n_threads = n_threads,
            .products = parse_products(products),
            .repack = !no_repack,
            .hash_cache_dir = hash_cache_dir};
}

EngineOptions EngineArgs::options() const {
    EngineOptions o;
    o.chunk_size = chunk;
    o.attention = parse_attention_kernel(attention);
    o.cache_types = {parse_cache_type(cache_type_k), parse_cache_type(cache_type_v), !no_kv_rotation};
    return o;
}

nlohmann::json EngineArgs::to_json() const {
    return {{"chunk_size", chunk},
            {"attention", attention},
            {"cache_type_k", cache_type_k},
            {"cache_type_v", cache_type_v},
            {"kv_rotation", !no_kv_rotation}};
}

Budget BudgetArgs::budget() const {
    Budget b;
    if (tokens >= 0)
        b = Budget::from_tokens(tokens);
    else if (ratio >= 0.0)
        b = Budget::from_ratio(ratio);
    else if (kv_bytes >= 0)
        b = Budget::from_bytes(kv_bytes);
    else if (bytes_ratio >= 0.0)
        b = Budget::from_bytes_ratio(bytes_ratio);
    else
        throw Error("cli", "a method needs --ratio R, --budget B, --kv-bytes N or --bytes-ratio R");
    if (!demote.empty() || high_share >= 0.0) {
        if (demote.empty()) throw Error("cli", "--high-share needs --demote TYPE");
        b.set_demotion(parse_cache_type(demote), high_share);
    }
    b.sliding = sliding;
    return b;
}

DecodePolicyOptions DecodeArgs::options() const {
    DecodePolicyOptions r = o;
    r.params = parse_params(params);
    return r;
}

namespace {
std::pair<std::string, std::string> split_kv(const std::string & kv, const std::string & whole) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
        throw Error("cli", "--param takes KEY=VALUE (or METHOD:KEY=VALUE), got '" + whole + "'");
    return {kv.substr(0, eq), kv.substr(eq + 1)};
}
}  // namespace

ParamMap parse_params(const std::vector<std::string> & kvs) {
    ParamMap m;
    for (const std::string & kv : kvs) {
        const auto [k, v] = split_kv(kv, kv);
        m[k] = v;
    }
    return m;
}

std::map<std::string, ParamMap> parse_method_params(const std::vector<std::string> & specs,
                                                    const std::vector<std::string> & methods) {
    std::map<std::string, ParamMap> out;
    for (const std::string & p : specs) {
        const size_t colon = p.find(':'), eq = p.find('=');
        std::string method;
        std::string kv = p;
        if (colon != std::string::npos && (eq == std::string::npos || colon < eq)) {
            method = p.substr(0, colon);
            kv = p.substr(colon + 1);
        } else if (methods.size() == 1) {
            method = methods[0];
        } else {
            throw Error("cli", "--param " + p + ": several methods run; say which with METHOD:KEY=VALUE");
        }
        if (std::find(methods.begin(), methods.end(), method) == methods.end())
            throw Error("cli", "--param " + p + ": no method " + method + " in the run");
        const auto [k, v] = split_kv(kv, p);
        out[method][k] = v;
    }
    return out;
}

}  // namespace kvlab::app
