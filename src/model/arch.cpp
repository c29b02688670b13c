#include "model/arch.h"

#include <map>

#include "gguf.h"
#include "kvlab/error.h"
#include "model/gguf_meta.h"

namespace kvlab {

namespace {
std::map<std::string, ArchEntry> & registry() {
    static std::map<std::string, ArchEntry> r;
    return r;
}
}  // namespace

void register_architecture(const std::string & name, ArchFactory make) {
    KVLAB_ASSERT(!registry().count(name), "architecture registered twice");
    registry()[name] = ArchEntry{name, make};
}

const ArchEntry * find_architecture(const std::string & name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> architecture_names() {
    std::vector<std::string> names;
    for (const auto & [name, _] : registry()) names.push_back(name);
    return names;
}

void ModelReader::fail(const std::string & what) const {
    throw Error("model", path_ + ": " + what);
}

bool ModelReader::number(const std::string & key, double & out) const {
    const int64_t id = gguf_find_key(gguf_, key.c_str());
    if (id < 0) return false;
    switch (gguf_get_kv_type(gguf_, id)) {
        case GGUF_TYPE_UINT8:
            out = gguf_get_val_u8(gguf_, id);
            return true;
        case GGUF_TYPE_INT8:
            out = gguf_get_val_i8(gguf_, id);
            return true;
        case GGUF_TYPE_UINT16:
            out = gguf_get_val_u16(gguf_, id);
            return true;
        case GGUF_TYPE_INT16:
            out = gguf_get_val_i16(gguf_, id);
            return true;
        case GGUF_TYPE_UINT32:
            out = gguf_get_val_u32(gguf_, id);
            return true;
        case GGUF_TYPE_INT32:
            out = gguf_get_val_i32(gguf_, id);
            return true;
        case GGUF_TYPE_UINT64:
            out = double(gguf_get_val_u64(gguf_, id));
            return true;
        case GGUF_TYPE_INT64:
            out = double(gguf_get_val_i64(gguf_, id));
            return true;
        case GGUF_TYPE_FLOAT32:
            out = gguf_get_val_f32(gguf_, id);
            return true;
        case GGUF_TYPE_FLOAT64:
            out = gguf_get_val_f64(gguf_, id);
            return true;
        default:
            return false;
    }
}

int32_t ModelReader::required_int(const std::string & key) const {
    double v = 0;
    if (!number(key, v)) fail("required metadata key '" + key + "' is missing");
    return int32_t(v);
}

int32_t ModelReader::get_int(const std::string & key, int32_t fallback) const {
    double v = 0;
    return number(key, v) ? int32_t(v) : fallback;
}

float ModelReader::get_float(const std::string & key, float fallback) const {
    double v = 0;
    return number(key, v) ? float(v) : fallback;
}

std::string ModelReader::get_string(const std::string & key) const {
    return gguf_string(gguf_, key);
}

ggml_tensor * ModelReader::optional(const std::string & name) const {
    return ggml_get_tensor(ctx_, name.c_str());
}

ggml_tensor * ModelReader::required(const std::string & name) const {
    ggml_tensor * t = optional(name);
    if (!t) fail("required tensor '" + name + "' is missing");
    return t;
}

ggml_tensor * ModelReader::required_layer(int il, const std::string & suffix) const {
    return required("blk." + std::to_string(il) + "." + suffix);
}

ggml_tensor * ModelReader::optional_layer(int il, const std::string & suffix) const {
    return optional("blk." + std::to_string(il) + "." + suffix);
}

}  // namespace kvlab
