// The method registry: methods register themselves (one file each); make_press builds one by
// name with its parameters checked; the kvpress preset; the list `kvlab methods` prints.
#include <algorithm>

#include "kvlab/error.h"
#include "press/method.h"

namespace kvlab {

namespace press {

namespace {
std::vector<Registration> & registry() {
    static std::vector<Registration> r;
    return r;
}
}  // namespace

void register_method(Registration r) {
    registry().push_back(std::move(r));
}

const Registration * find_method(const std::string & name) {
    for (const Registration & r : registry())
        if (r.info.name == name) return &r;
    return nullptr;
}

std::vector<const Registration *> all_methods() {
    std::vector<const Registration *> v;
    for (const Registration & r : registry()) v.push_back(&r);
    std::sort(v.begin(), v.end(), [](auto * a, auto * b) {
        return a->info.wrapper != b->info.wrapper ? !a->info.wrapper : a->info.name < b->info.name;
    });
    return v;
}

}  // namespace press

std::unique_ptr<Press> make_press(const std::string & name, const ParamMap & params, const Model & model) {
    const press::Registration * r = press::find_method(name);
    if (!r) {
        std::string known;
        for (const press::Registration * m : press::all_methods()) known += (known.empty() ? "" : ", ") + m->info.name;
        throw Error("press", "unknown method '" + name + "' (methods: " + known + ")");
    }
    const std::vector<ParamSpec> specs =
        r->info.wrapper ? press::wrapper_specs(r->info.params, params) : r->info.params;
    press::Params p(name, specs, params);
    std::unique_ptr<Press> out = r->make(p, model);
    out->name_ = name;
    out->params_ = p.json();
    out->observes_ = r->info.wrapper ? press::find_method(p.get_string("base"))->info.observes : r->info.observes;
    return out;
}

ParamMap apply_preset(const std::string & preset, const std::string & method, const ParamMap & params) {
    if (preset.empty()) return params;
    if (preset != "kvpress") throw Error("press", "unknown preset '" + preset + "' (presets: kvpress)");
    const press::Registration * r = press::find_method(method);
    if (!r) return params;  // make_press names the unknown method
    ParamMap out = r->info.kvpress_params;
    for (const auto & [k, v] : params) out[k] = v;
    return out;
}

nlohmann::json MethodInfo::to_json() const {
    nlohmann::json ps = nlohmann::json::array();
    for (const ParamSpec & p : params)
        ps.push_back({{"name", p.name}, {"default", p.def}, {"help", p.help}, {"choices", p.choices}});
    return {{"name", name},
            {"summary", summary},
            {"wrapper", wrapper},
            {"scores_from_prefill", observes},
            {"scores_while_decoding", decodes},
            {"params", ps},
            {"kvpress_preset", kvpress_params},
            {"differs_from_kvpress_under_preset", kvpress_differs},
            {"defaults_differ_from_kvpress", defaults_differ}};
}

std::vector<MethodInfo> press_methods() {
    std::vector<MethodInfo> v;
    for (const press::Registration * r : press::all_methods()) {
        MethodInfo info = r->info;
        info.decodes = bool(r->segment);
        if (info.wrapper) {  // a wrapper observes when its base does: report its default base
            const press::Registration * base = press::find_method(press::wrapper_base_param()[0].def);
            info.observes = base && base->info.observes;
        }
        v.push_back(std::move(info));
    }
    return v;
}

}  // namespace kvlab
