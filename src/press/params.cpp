// A method's parameters: the user's text values checked against the method's specs (names,
// choices) and read as typed values.
#include <algorithm>
#include <cmath>

#include "kvlab/error.h"
#include "press/method.h"

namespace kvlab::press {

Params::Params(const std::string & method, const std::vector<ParamSpec> & specs, const ParamMap & given)
    : method_(method) {
    for (const ParamSpec & s : specs) values_[s.name] = s.def;
    for (const auto & [k, v] : given) {
        if (!values_.count(k)) {
            std::string known;
            for (const ParamSpec & s : specs) known += (known.empty() ? "" : ", ") + s.name;
            throw Error("press", "unknown parameter '" + k + "' for method " + method +
                                     (known.empty() ? " (it takes none)" : " (known: " + known + ")"));
        }
        values_[k] = v;
    }
    for (const ParamSpec & s : specs) {
        if (s.choices.empty() || std::find(s.choices.begin(), s.choices.end(), values_[s.name]) != s.choices.end())
            continue;
        std::string list;
        for (const std::string & c : s.choices) list += (list.empty() ? "" : ", ") + c;
        throw Error("press", method + ": parameter " + s.name + " takes " + list + "; got '" + values_[s.name] + "'");
    }
}

const std::string & Params::raw(const std::string & name) const {
    auto it = values_.find(name);
    KVLAB_ASSERT(it != values_.end(), "parameter declared by the method");
    return it->second;
}

int64_t Params::get_int(const std::string & name) const {
    const std::string & v = raw(name);
    size_t used = 0;
    int64_t x = 0;
    try {
        x = std::stoll(v, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used == 0 || used != v.size())
        throw Error("press", method_ + ": parameter " + name + " must be an integer, got '" + v + "'");
    return x;
}

double Params::get_float(const std::string & name) const {
    const std::string & v = raw(name);
    size_t used = 0;
    double x = 0;
    try {
        x = std::stod(v, &used);
    } catch (const std::exception &) {
        used = 0;
    }
    if (used == 0 || used != v.size() || !std::isfinite(x))
        throw Error("press", method_ + ": parameter " + name + " must be a number, got '" + v + "'");
    return x;
}

bool Params::get_bool(const std::string & name) const {
    const std::string & v = raw(name);
    if (v == "true" || v == "1" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "no") return false;
    throw Error("press", method_ + ": parameter " + name + " must be true or false, got '" + v + "'");
}

std::string Params::get_string(const std::string & name) const {
    return raw(name);
}

nlohmann::json Params::json() const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto & [k, v] : values_) j[k] = v;
    return j;
}

}  // namespace kvlab::press
