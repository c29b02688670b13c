#include "model/arch.h"

#include <cmath>
#include <cstdio>
#include <map>

#include "ggml-cpu.h"
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

namespace {

std::string number_text(double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return buf;
}

}  // namespace

int32_t ModelReader::required_int(const std::string & key, int32_t lo, int32_t hi) const {
    double v = 0;
    if (!number(key, v)) fail("required metadata key '" + key + "' is missing");
    return get_int(key, 0, lo, hi);
}

int32_t ModelReader::get_int(const std::string & key, int32_t fallback, int32_t lo, int32_t hi) const {
    double v = 0;
    if (!number(key, v)) return fallback;
    if (!(v == std::floor(v)) || v < double(lo) || v > double(hi))
        fail("metadata key '" + key + "' = " + number_text(v) + " is not a whole number in [" + std::to_string(lo) +
             ", " + std::to_string(hi) + "]");
    return int32_t(v);
}

float ModelReader::get_float(const std::string & key, float fallback, float lo, float hi) const {
    double v = 0;
    if (!number(key, v)) return fallback;
    if (!std::isfinite(v) || v < double(lo) || v > double(hi))
        fail("metadata key '" + key + "' = " + number_text(v) + " is not in [" + number_text(lo) + ", " +
             number_text(hi) + "]");
    return float(v);
}

std::string ModelReader::get_string(const std::string & key) const {
    return gguf_string(gguf_, key);
}

namespace {

std::string shape_text(const ggml_tensor * t) {
    std::string s = "[";
    for (int d = 0; d < ggml_n_dims(t); ++d) s += (d ? ", " : "") + std::to_string(t->ne[d]);
    return s + "]";
}

std::string shape_text(const std::vector<int64_t> & shape) {
    std::string s = "[";
    for (size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + (shape[d] < 0 ? "*" : std::to_string(shape[d]));
    return s + "]";
}

}  // namespace

ggml_tensor * ModelReader::optional(const std::string & name, std::vector<int64_t> shape, Role role) const {
    ggml_tensor * t = ggml_get_tensor(ctx_, name.c_str());
    if (!t) return nullptr;
    bool ok = shape.size() <= size_t(GGML_MAX_DIMS);
    for (int d = 0; ok && d < GGML_MAX_DIMS; ++d) {
        const int64_t want = size_t(d) < shape.size() ? shape[size_t(d)] : 1;
        ok = want < 0 ? t->ne[d] > 0 : t->ne[d] == want;
    }
    if (!ok) fail("tensor '" + name + "' has shape " + shape_text(t) + "; the architecture needs " + shape_text(shape));
    if (role == Role::vector) {
        if (t->type != GGML_TYPE_F32)
            fail("tensor '" + name + "' has type " + ggml_type_name(t->type) + "; a norm, bias or factor must be f32");
    } else {
        const auto * cpu = ggml_get_type_traits_cpu(t->type);
        const auto * traits = ggml_get_type_traits(t->type);
        const bool converts = t->type == GGML_TYPE_F32 || (cpu && cpu->vec_dot && traits && traits->to_float);
        if (!converts || t->ne[0] % ggml_blck_size(t->type) != 0)
            fail("tensor '" + name + "' has type " + ggml_type_name(t->type) +
                 ", which ggml's CPU backend cannot multiply");
    }
    return t;
}

ggml_tensor * ModelReader::required(const std::string & name, std::vector<int64_t> shape, Role role) const {
    ggml_tensor * t = optional(name, shape, role);
    if (!t) fail("required tensor '" + name + "' is missing");
    return t;
}

ggml_tensor * ModelReader::required_layer(int il, const std::string & suffix, std::vector<int64_t> shape,
                                          Role role) const {
    return required("blk." + std::to_string(il) + "." + suffix, std::move(shape), role);
}

ggml_tensor * ModelReader::optional_layer(int il, const std::string & suffix, std::vector<int64_t> shape,
                                          Role role) const {
    return optional("blk." + std::to_string(il) + "." + suffix, std::move(shape), role);
}

}  // namespace kvlab
