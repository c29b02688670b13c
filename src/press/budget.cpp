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

int64_t Budget::per_layer(int64_t L) const {
    if (tokens >= 0) return tokens;
    // kvpress's rule, in the same double arithmetic: n_kept = int(L * (1 - cr)), the kept
    // count rounded down (so a budget matches kvpress row for row)
    return int64_t(double(L) * (1.0 - ratio));
}

double Budget::keep_fraction(int64_t L) const {
    return tokens >= 0 ? double(tokens) / double(L) : 1.0 - ratio;
}

nlohmann::json Budget::to_json() const {
    nlohmann::json j = tokens >= 0 ? nlohmann::json{{"tokens", tokens}} : nlohmann::json{{"ratio", ratio}};
    if (sliding) j["sliding"] = true;
    return j;
}

Budget Budget::from_json(const nlohmann::json & j) {
    if (j.is_number()) return from_ratio(j.get<double>());
    if (!j.is_object()) throw Error("press", "a budget is {\"ratio\": R} or {\"tokens\": B}, got " + j.dump());
    for (const auto & [k, v] : j.items())
        if (k != "ratio" && k != "tokens" && k != "sliding")
            throw Error("press", "unknown budget key '" + k + "' (ratio, tokens, sliding)");
    const bool ratio = j.contains("ratio"), tokens = j.contains("tokens");
    if (ratio == tokens) throw Error("press", "a budget has exactly one of 'ratio' and 'tokens', got " + j.dump());
    if (ratio && !j["ratio"].is_number()) throw Error("press", "a budget's 'ratio' is a number in [0, 1)");
    if (tokens && !j["tokens"].is_number_integer()) throw Error("press", "a budget's 'tokens' is a whole number");
    Budget b = ratio ? from_ratio(j["ratio"].get<double>()) : from_tokens(j["tokens"].get<int64_t>());
    if (j.contains("sliding")) {
        if (!j["sliding"].is_boolean()) throw Error("press", "a budget's 'sliding' is true or false");
        b.sliding = j["sliding"].get<bool>();
    }
    return b;
}

std::string Budget::describe() const {
    std::ostringstream o;
    if (tokens >= 0)
        o << "budget " << tokens << " tokens";
    else
        o << "ratio " << ratio;
    if (sliding) o << " (sliding-window layers too)";
    return o.str();
}

}  // namespace kvlab
