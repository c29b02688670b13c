#include "model/arch.h"

#include <map>

#include "ggml.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {
std::map<std::string, std::unique_ptr<Architecture>> & registry() {
    static std::map<std::string, std::unique_ptr<Architecture>> r;
    return r;
}
}  // namespace

void register_architecture(std::unique_ptr<Architecture> arch) {
    auto name = arch->name();
    KVLAB_ASSERT(!registry().count(name), "architecture registered twice");
    registry()[name] = std::move(arch);
}

const Architecture * find_architecture(const std::string & name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : it->second.get();
}

std::vector<std::string> architecture_names() {
    std::vector<std::string> names;
    for (const auto & [name, _] : registry()) names.push_back(name);
    return names;
}

ggml_tensor * TensorLookup::optional(const std::string & name) const { return ggml_get_tensor(ctx_, name.c_str()); }

ggml_tensor * TensorLookup::required(const std::string & name) const {
    ggml_tensor * t = optional(name);
    if (!t) throw Error("model", path_ + ": required tensor '" + name + "' is missing");
    return t;
}

ggml_tensor * TensorLookup::required_layer(int il, const std::string & suffix) const {
    return required("blk." + std::to_string(il) + "." + suffix);
}

ggml_tensor * TensorLookup::optional_layer(int il, const std::string & suffix) const {
    return optional("blk." + std::to_string(il) + "." + suffix);
}

void Architecture::load_layer(const TensorLookup & t, int il, LayerWeights & lw) const {
    lw.attn_norm = t.required_layer(il, "attn_norm.weight");
    lw.wq = t.required_layer(il, "attn_q.weight");
    lw.wk = t.required_layer(il, "attn_k.weight");
    lw.wv = t.required_layer(il, "attn_v.weight");
    lw.wo = t.required_layer(il, "attn_output.weight");
    lw.bq = t.optional_layer(il, "attn_q.bias");
    lw.bk = t.optional_layer(il, "attn_k.bias");
    lw.bv = t.optional_layer(il, "attn_v.bias");
    lw.ffn_norm = t.required_layer(il, "ffn_norm.weight");
    lw.ffn_gate = t.required_layer(il, "ffn_gate.weight");
    lw.ffn_up = t.required_layer(il, "ffn_up.weight");
    lw.ffn_down = t.required_layer(il, "ffn_down.weight");
}

}  // namespace kvlab
