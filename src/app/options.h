// The choices a front end takes as strings (the CLI's flags, the Python module's keyword
// arguments), turned into the options of the layers below: the kernels', the engine's, a budget,
// method parameters and a decoding policy. Each throws kvlab::Error naming a bad value.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/decode_policy.h"
#include "kvlab/engine.h"
#include "kvlab/model.h"
#include "kvlab/press.h"

namespace kvlab::app {

// The kernels' choices: products (auto, ggml, amx, vnni) and no_repack (llama.cpp's --no-repack).
struct KernelArgs {
    std::string products = "auto";
    bool no_repack = false;
    // throws for products amx where the CPU lacks it; hash_cache_dir memoises file hashes
    ModelOptions options(int n_threads, const std::string & hash_cache_dir) const;
};

// The engine's choices: chunk, attention (kvlab, ggml), the K / V row types (f16, q8_0, q4_0)
// and whether quantized rows are rotated.
struct EngineArgs {
    int chunk = 512;
    std::string attention = "kvlab";
    std::string cache_type_k = "f16", cache_type_v = "f16";
    bool no_kv_rotation = false;  // quantized rows stored as they are (CacheTypes::rotate)
    EngineOptions options() const;
    nlohmann::json to_json() const;  // {chunk_size, attention, cache_type_k, cache_type_v, kv_rotation}
};

// One budget: ratio R | tokens B | kv_bytes N | bytes_ratio R (negative: not given), and demotion.
struct BudgetArgs {
    double ratio = -1.0;
    int64_t tokens = -1;
    int64_t kv_bytes = -1;
    double bytes_ratio = -1.0;
    std::string demote;        // "" : rows are evicted
    double high_share = -1.0;  // < 0: unset
    bool sliding = false;      // compress the sliding-window layers too
    bool given() const { return ratio >= 0.0 || tokens >= 0 || kv_bytes >= 0 || bytes_ratio >= 0.0; }
    bool any() const { return given() || !demote.empty() || high_share >= 0.0; }  // a budget option at all
    Budget budget() const;                                                        // throws when none was given
};

// Compression while decoding: the policy's options and its method's KEY=VALUE parameters.
struct DecodeArgs {
    DecodePolicyOptions o;
    std::vector<std::string> params;
    DecodePolicyOptions options() const;  // the parameters parsed
};

// KEY=VALUE strings as a method's parameters.
ParamMap parse_params(const std::vector<std::string> & kvs);
// `METHOD:KEY=VALUE` (or a bare KEY=VALUE when exactly one method runs) as METHOD -> its
// parameters; throws naming a parameter whose method is not in `methods`.
std::map<std::string, ParamMap> parse_method_params(const std::vector<std::string> & specs,
                                                    const std::vector<std::string> & methods);

}  // namespace kvlab::app
