// Budget: how much of a context each layer and head keeps, and its one JSON form.
#include <sstream>

#include "kvlab/error.h"
#include "kvlab/press.h"

namespace kvlab {

Budget Budget::from_ratio(double r) {
    if (!(r >= 0.0 && r < 1.0)) throw Error("press", "compression ratio must lie in [0, 1), got " + std::to_string(r));
    Budget b;
    b.ratio = r;
    return b;
}

Budget Budget::from_tokens(int64_t t) {
    if (t < 1) throw Error("press", "token budget must be at least 1, got " + std::to_string(t));
    Budget b;
    b.tokens = t;
    return b;
}

Budget Budget::from_bytes(int64_t n) {
    if (n < 1) throw Error("press", "a byte budget must be at least 1 byte, got " + std::to_string(n));
    Budget b;
    b.kv_bytes = n;
    return b;
}

Budget Budget::from_bytes_ratio(double r) {
    if (!(r > 0.0 && r <= 1.0))
        throw Error("press",
                    "a bytes ratio (of the F16 full cache's bytes) must lie in (0, 1], got " + std::to_string(r));
    Budget b;
    b.bytes_ratio = r;
    return b;
}

void Budget::set_demotion(ggml_type type, double share) {
    if (type != GGML_TYPE_Q8_0 && type != GGML_TYPE_Q4_0 && type != GGML_TYPE_COUNT)
        throw Error("press", std::string("rows are demoted to q8_0 or q4_0, not ") + ggml_type_name(type));
    if (share > 1.0)
        throw Error("press", "the high share of a byte budget lies in [0, 1], got " + std::to_string(share));
    if (share >= 0.0 && type == GGML_TYPE_COUNT) throw Error("press", "a high share needs a demotion type");
    demote = type;
    high_share = share < 0.0 ? -1.0 : share;
}

int64_t Budget::per_layer(int64_t L) const {
    if (by_bytes()) throw Error("press", "a byte budget has no row count before compress() derives one");
    if (tokens >= 0) return tokens;
    // kvpress's rule, in the same double arithmetic: n_kept = int(L * (1 - cr)), the kept
    // count rounded down (so a budget matches kvpress row for row)
    return int64_t(double(L) * (1.0 - ratio));
}

double Budget::keep_fraction(int64_t L) const {
    return tokens >= 0 ? double(tokens) / double(L) : 1.0 - ratio;
}

nlohmann::json Budget::to_json() const {
    nlohmann::json j = kv_bytes >= 0       ? nlohmann::json{{"kv_bytes", kv_bytes}}
                       : bytes_ratio > 0.0 ? nlohmann::json{{"bytes_ratio", bytes_ratio}}
                       : tokens >= 0       ? nlohmann::json{{"tokens", tokens}}
                                           : nlohmann::json{{"ratio", ratio}};
    if (sliding) j["sliding"] = true;
    if (demotes()) {
        j["demote"] = ggml_type_name(demote);
        if (high_share >= 0.0) j["high_share"] = high_share;
    }
    return j;
}

Budget Budget::from_json(const nlohmann::json & j) {
    if (j.is_number()) return from_ratio(j.get<double>());
    if (!j.is_object()) throw Error("press", "a budget is {\"ratio\": R} or {\"tokens\": B}, got " + j.dump());
    for (const auto & [k, v] : j.items())
        if (k != "ratio" && k != "tokens" && k != "kv_bytes" && k != "bytes_ratio" && k != "sliding" && k != "demote" &&
            k != "high_share")
            throw Error("press", "unknown budget key '" + k +
                                     "' (ratio, tokens, kv_bytes, bytes_ratio, sliding, demote, high_share)");
    const int kinds = int(j.contains("ratio")) + int(j.contains("tokens")) + int(j.contains("kv_bytes")) +
                      int(j.contains("bytes_ratio"));
    if (kinds != 1)
        throw Error("press",
                    "a budget has exactly one of 'ratio', 'tokens', 'kv_bytes' and 'bytes_ratio', got " + j.dump());
    auto number = [&j](const char * key, bool whole) {
        const nlohmann::json & v = j[key];
        if (whole ? !v.is_number_integer() : !v.is_number())
            throw Error("press", std::string("a budget's '") + key + "' is " + (whole ? "a whole number" : "a number"));
        return v;
    };
    Budget b = j.contains("ratio")      ? from_ratio(number("ratio", false).get<double>())
               : j.contains("tokens")   ? from_tokens(number("tokens", true).get<int64_t>())
               : j.contains("kv_bytes") ? from_bytes(number("kv_bytes", true).get<int64_t>())
                                        : from_bytes_ratio(number("bytes_ratio", false).get<double>());
    if (j.contains("demote") || j.contains("high_share")) {
        if (!j.contains("demote") || !j["demote"].is_string())
            throw Error("press", "a budget's 'demote' is a type name (q8_0, q4_0)");
        b.set_demotion(parse_cache_type(j["demote"].get<std::string>()),
                       j.contains("high_share") ? number("high_share", false).get<double>() : -1.0);
    }
    if (j.contains("sliding")) {
        if (!j["sliding"].is_boolean()) throw Error("press", "a budget's 'sliding' is true or false");
        b.sliding = j["sliding"].get<bool>();
    }
    return b;
}

std::string Budget::describe() const {
    std::ostringstream o;
    if (kv_bytes >= 0)
        o << "budget " << kv_bytes << " bytes";
    else if (bytes_ratio > 0.0)
        o << "bytes ratio " << bytes_ratio << " of the F16 full cache";
    else if (tokens >= 0)
        o << "budget " << tokens << " tokens";
    else
        o << "ratio " << ratio;
    if (demotes()) {
        o << ", demoting to " << ggml_type_name(demote);
        if (high_share >= 0.0) o << " (high share " << high_share << ")";
    }
    if (sliding) o << " (sliding-window layers too)";
    return o.str();
}

}  // namespace kvlab
