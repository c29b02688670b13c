#include "kvlab/model.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "model/arch.h"
#include "model/gguf_meta.h"

namespace kvlab {

namespace {

// Reads a numeric KV of any integer or float GGUF type; returns false when absent.
bool get_number(const gguf_context * g, const std::string & key, double & out) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) return false;
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8: out = gguf_get_val_u8(g, id); return true;
        case GGUF_TYPE_INT8: out = gguf_get_val_i8(g, id); return true;
        case GGUF_TYPE_UINT16: out = gguf_get_val_u16(g, id); return true;
        case GGUF_TYPE_INT16: out = gguf_get_val_i16(g, id); return true;
        case GGUF_TYPE_UINT32: out = gguf_get_val_u32(g, id); return true;
        case GGUF_TYPE_INT32: out = gguf_get_val_i32(g, id); return true;
        case GGUF_TYPE_UINT64: out = double(gguf_get_val_u64(g, id)); return true;
        case GGUF_TYPE_INT64: out = double(gguf_get_val_i64(g, id)); return true;
        case GGUF_TYPE_FLOAT32: out = gguf_get_val_f32(g, id); return true;
        case GGUF_TYPE_FLOAT64: out = gguf_get_val_f64(g, id); return true;
        default: return false;
    }
}

int32_t get_int(const gguf_context * g, const std::string & key, const std::string & path, int32_t fallback = -1) {
    double v = 0;
    if (get_number(g, key, v)) return int32_t(v);
    if (fallback >= 0) return fallback;
    throw Error("model", path + ": required metadata key '" + key + "' is missing");
}

float get_float(const gguf_context * g, const std::string & key, float fallback) {
    double v = 0;
    return get_number(g, key, v) ? float(v) : fallback;
}

std::string get_string(const gguf_context * g, const std::string & key) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0 || gguf_get_kv_type(g, id) != GGUF_TYPE_STRING) return "";
    return gguf_get_val_str(g, id);
}

HParams read_hparams(const gguf_context * g, const std::string & arch, const std::string & path) {
    HParams hp;
    hp.arch = arch;
    const std::string a = arch + ".";
    hp.n_layer = get_int(g, a + "block_count", path);
    hp.n_embd = get_int(g, a + "embedding_length", path);
    hp.n_ff = get_int(g, a + "feed_forward_length", path);
    hp.n_head = get_int(g, a + "attention.head_count", path);
    hp.n_head_kv = get_int(g, a + "attention.head_count_kv", path, hp.n_head);
    hp.head_dim = get_int(g, a + "attention.key_length", path, hp.n_embd / std::max(1, hp.n_head));
    const int32_t v_dim = get_int(g, a + "attention.value_length", path, hp.head_dim);
    hp.n_ctx_train = get_int(g, a + "context_length", path);
    hp.rms_eps = get_float(g, a + "attention.layer_norm_rms_epsilon", 1e-5f);
    hp.n_rot = get_int(g, a + "rope.dimension_count", path, hp.head_dim);
    hp.rope_theta = get_float(g, a + "rope.freq_base", 10000.0f);
    const std::string scaling = get_string(g, a + "rope.scaling.type");
    const float factor = get_float(g, a + "rope.scaling.factor", 0.0f);
    if (!scaling.empty()) hp.rope_scaling_type = scaling;
    if (scaling == "linear" && factor > 0.0f) hp.rope_freq_scale = 1.0f / factor;
    if (scaling == "yarn" || scaling == "longrope")
        throw Error("model", path + ": RoPE scaling '" + scaling + "' is not supported yet");
    hp.sliding_window = get_int(g, a + "attention.sliding_window", path, 0);
    const int64_t tok_id = gguf_find_key(g, "tokenizer.ggml.tokens");
    hp.n_vocab = get_int(g, a + "vocab_size", path, tok_id >= 0 ? int32_t(gguf_get_arr_n(g, tok_id)) : 0);

    if (hp.n_layer <= 0 || hp.n_embd <= 0 || hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv != 0)
        throw Error("model", path + ": inconsistent attention hyper-parameters");
    if (v_dim != hp.head_dim) throw Error("model", path + ": key and value head sizes differ (unsupported)");
    if (hp.n_rot != hp.head_dim) throw Error("model", path + ": partial RoPE is not supported");
    if (hp.sliding_window > 0) throw Error("model", path + ": sliding-window attention is not supported yet");
    return hp;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string & path, int n_threads) {
    const double t0 = now_seconds();
    std::unique_ptr<Model> m(new Model());
    m->path_ = path;
    m->n_threads_ = std::max(1, n_threads);

    m->gguf_ = open_gguf_checked(path, /*no_alloc=*/true, &m->ctx_);
    const std::string arch = get_string(m->gguf_, "general.architecture");
    if (arch.empty()) throw Error("model", path + ": no general.architecture in the GGUF metadata");
    m->arch_ = find_architecture(arch);
    if (!m->arch_) {
        std::string known;
        for (const auto & n : architecture_names()) known += (known.empty() ? "" : ", ") + n;
        throw Error("model", path + ": unsupported architecture '" + arch + "' (kvlab supports: " + known + ")");
    }
    m->hparams_ = read_hparams(m->gguf_, arch, path);
    m->arch_->load_hparams(m->gguf_, m->hparams_);

    TensorLookup t(m->ctx_, path);
    Weights & w = m->weights_;
    w.tok_embd = t.required("token_embd.weight");
    w.output_norm = t.required("output_norm.weight");
    w.output = t.optional("output.weight");
    if (!w.output) w.output = w.tok_embd;
    w.rope_freqs = t.optional("rope_freqs.weight");
    if (w.tok_embd->ne[0] != m->hparams_.n_embd) throw Error("model", path + ": token_embd has the wrong width");
    m->hparams_.n_vocab = int32_t(w.output->ne[1]);
    w.layers.resize(m->hparams_.n_layer);
    for (int il = 0; il < m->hparams_.n_layer; ++il) m->arch_->load_layer(t, il, w.layers[il]);

    m->backend_ = ggml_backend_cpu_init();
    if (!m->backend_) throw Error("backend", "could not initialise the ggml CPU backend");
    ggml_backend_cpu_set_n_threads(m->backend_, m->n_threads_);
    m->buffer_ = ggml_backend_alloc_ctx_tensors(m->ctx_, m->backend_);
    if (!m->buffer_) throw Error("backend", "could not allocate the weight buffer for " + path);
    ggml_backend_buffer_set_usage(m->buffer_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    std::FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) throw Error("model", "cannot open " + path);
    const size_t data_offset = gguf_get_data_offset(m->gguf_);
    std::vector<uint8_t> staging;
    for (int64_t i = 0; i < gguf_get_n_tensors(m->gguf_); ++i) {
        ggml_tensor * tensor = ggml_get_tensor(m->ctx_, gguf_get_tensor_name(m->gguf_, i));
        const size_t n = ggml_nbytes(tensor);
        const size_t off = data_offset + gguf_get_tensor_offset(m->gguf_, i);
        void * dst = tensor->data;
        if (!ggml_backend_buffer_is_host(m->buffer_)) {
            staging.resize(n);
            dst = staging.data();
        }
        if (fseeko(f, off_t(off), SEEK_SET) != 0 || std::fread(dst, 1, n, f) != n) {
            std::fclose(f);
            throw Error("gguf", path + ": could not read tensor '" + std::string(tensor->name) + "' (truncated?)");
        }
        if (dst != tensor->data) ggml_backend_tensor_set(tensor, dst, 0, n);
    }
    std::fclose(f);
    m->load_seconds_ = now_seconds() - t0;
    return m;
}

Model::~Model() {
    if (buffer_) ggml_backend_buffer_free(buffer_);
    if (backend_) ggml_backend_free(backend_);
    if (ctx_) ggml_free(ctx_);
    if (gguf_) gguf_free(gguf_);
}

void Model::set_n_threads(int n_threads) {
    n_threads_ = std::max(1, n_threads);
    ggml_backend_cpu_set_n_threads(backend_, n_threads_);
}

uint64_t Model::weight_bytes() const { return ggml_backend_buffer_get_size(buffer_); }

std::string Model::backend_name() const { return ggml_backend_name(backend_); }

}  // namespace kvlab
