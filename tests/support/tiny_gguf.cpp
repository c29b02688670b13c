#include "support/tiny_gguf.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "gguf.h"
#include "kvlab/error.h"
#include "llama.h"

namespace kvlab::test {
namespace {

constexpr const char * k_component = "tiny_gguf";
constexpr float k_noise = 0.05f;  // std of the noise on norms (around 1) and of biases (around 0)

struct GgufFree {
    void operator()(gguf_context * c) const { gguf_free(c); }
};
struct GgmlFree {
    void operator()(ggml_context * c) const { ggml_free(c); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufFree>;
using GgmlPtr = std::unique_ptr<ggml_context, GgmlFree>;

// Standard normal numbers by Box-Muller over mt19937_64, so that a seed gives the same
// weights with every standard library (std::normal_distribution is implementation-defined).
class Normal {
public:
    explicit Normal(uint64_t seed) : rng_(seed) {}
    float operator()() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        const double u1 = 1.0 - double(rng_() >> 11) * 0x1.0p-53;  // (0, 1]
        const double u2 = double(rng_() >> 11) * 0x1.0p-53;        // [0, 1)
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double t = 2.0 * M_PI * u2;
        spare_ = float(r * std::sin(t));
        has_spare_ = true;
        return float(r * std::cos(t));
    }

private:
    std::mt19937_64 rng_;
    float spare_ = 0.0f;
    bool has_spare_ = false;
};

enum class Kind { Matrix, Norm, Bias };

// One tensor of the file: name and ggml shape (ne0 is the input dim of a matmul weight).
struct TensorPlan {
    std::string name;
    Kind kind;
    int64_t ne0;
    int64_t ne1;  // 1 for vectors
};

void check(bool ok, const std::string & message) {
    if (!ok) throw Error(k_component, message);
}

void validate(const TinySpec & s) {
    check(s.arch == "llama" || s.arch == "qwen2" || s.arch == "qwen3",
          "unsupported arch '" + s.arch + "' (llama, qwen2, qwen3)");
    check(s.n_layer > 0 && s.n_embd > 0 && s.n_head > 0 && s.n_head_kv > 0 && s.head_dim > 0 && s.n_ff > 0 &&
              s.n_ctx_train > 0,
          "every size of the spec must be positive");
    check(s.n_head % s.n_head_kv == 0, "n_head must be a multiple of n_head_kv");
    check(s.head_dim % 2 == 0, "head_dim must be even (RoPE rotates pairs)");
    if (s.arch == "qwen2") {
        check(s.n_head * s.head_dim == s.n_embd, "qwen2 in llama.cpp needs n_head * head_dim == n_embd");
    }
    check(s.weight_type == GGML_TYPE_F32 || s.weight_type == GGML_TYPE_F16 || s.weight_type == GGML_TYPE_Q8_0,
          std::string("weight_type must be F32, F16 or Q8_0, not ") + ggml_type_name(s.weight_type));
    const int64_t blck = ggml_blck_size(s.weight_type);
    check(s.n_embd % blck == 0 && s.n_ff % blck == 0 && (s.n_head * s.head_dim) % blck == 0,
          "n_embd, n_ff and n_head * head_dim must be multiples of " + std::to_string(blck) + " for " +
              ggml_type_name(s.weight_type));
}

// Every tensor llama.cpp's loader creates for the arch (src/models/<arch>.cpp), in file order.
std::vector<TensorPlan> plan_tensors(const TinySpec & s, int64_t n_vocab) {
    const int64_t n_q = int64_t(s.n_head) * s.head_dim;      // query width
    const int64_t n_kv = int64_t(s.n_head_kv) * s.head_dim;  // key / value width
    std::vector<TensorPlan> p;
    p.push_back({"token_embd.weight", Kind::Matrix, s.n_embd, n_vocab});
    for (int il = 0; il < s.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        p.push_back({b + "attn_norm.weight", Kind::Norm, s.n_embd, 1});
        p.push_back({b + "attn_q.weight", Kind::Matrix, s.n_embd, n_q});
        p.push_back({b + "attn_k.weight", Kind::Matrix, s.n_embd, n_kv});
        p.push_back({b + "attn_v.weight", Kind::Matrix, s.n_embd, n_kv});
        if (s.arch == "qwen2") {
            p.push_back({b + "attn_q.bias", Kind::Bias, n_q, 1});
            p.push_back({b + "attn_k.bias", Kind::Bias, n_kv, 1});
            p.push_back({b + "attn_v.bias", Kind::Bias, n_kv, 1});
        }
        if (s.arch == "qwen3") {
            p.push_back({b + "attn_q_norm.weight", Kind::Norm, s.head_dim, 1});
            p.push_back({b + "attn_k_norm.weight", Kind::Norm, s.head_dim, 1});
        }
        p.push_back({b + "attn_output.weight", Kind::Matrix, n_q, s.n_embd});
        p.push_back({b + "ffn_norm.weight", Kind::Norm, s.n_embd, 1});
        p.push_back({b + "ffn_gate.weight", Kind::Matrix, s.n_embd, s.n_ff});
        p.push_back({b + "ffn_up.weight", Kind::Matrix, s.n_embd, s.n_ff});
        p.push_back({b + "ffn_down.weight", Kind::Matrix, s.n_ff, s.n_embd});
    }
    p.push_back({"output_norm.weight", Kind::Norm, s.n_embd, 1});
    if (!s.tie_embeddings) p.push_back({"output.weight", Kind::Matrix, s.n_embd, n_vocab});
    return p;
}

// F32 values of one tensor: matrices N(0, 1/ne0), norms 1 + noise, biases noise.
std::vector<float> draw(const TensorPlan & t, Normal & normal) {
    std::vector<float> v(size_t(t.ne0 * t.ne1));
    const float std_dev = t.kind == Kind::Matrix ? 1.0f / std::sqrt(float(t.ne0)) : k_noise;
    const float mean = t.kind == Kind::Norm ? 1.0f : 0.0f;
    for (float & x : v) x = mean + std_dev * normal();
    return v;
}

// Stores F32 values into t (F32, F16 or Q8_0; rows of ne[0] values).
void store(ggml_tensor * t, const std::vector<float> & v) {
    switch (t->type) {
        case GGML_TYPE_F32:
            std::memcpy(t->data, v.data(), v.size() * sizeof(float));
            break;
        case GGML_TYPE_F16:
            ggml_fp32_to_fp16_row(v.data(), static_cast<ggml_fp16_t *>(t->data), int64_t(v.size()));
            break;
        default:
            ggml_quantize_chunk(t->type, v.data(), t->data, 0, t->ne[1], t->ne[0], nullptr);
            break;
    }
}

uint32_t file_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F16:
            return LLAMA_FTYPE_MOSTLY_F16;
        case GGML_TYPE_Q8_0:
            return LLAMA_FTYPE_MOSTLY_Q8_0;
        default:
            return LLAMA_FTYPE_ALL_F32;
    }
}

// The tokenizer.* keys of the GGUF at path, in a context of their own.
GgufPtr tokenizer_kv(const std::string & path) {
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx = nullptr;
    GgufPtr src(gguf_init_from_file(path.c_str(), params));
    check(src != nullptr, "cannot read GGUF metadata of vocabulary source " + path);
    GgufPtr kv(gguf_init_empty());
    gguf_set_kv(kv.get(), src.get());
    std::vector<std::string> other;
    for (int64_t i = 0; i < gguf_get_n_kv(kv.get()); ++i) {
        const std::string key = gguf_get_key(kv.get(), i);
        if (key.rfind("tokenizer.", 0) != 0) other.push_back(key);
    }
    for (const auto & key : other) gguf_remove_key(kv.get(), key.c_str());
    const int64_t tokens = gguf_find_key(kv.get(), "tokenizer.ggml.tokens");
    check(tokens >= 0 && gguf_get_kv_type(kv.get(), tokens) == GGUF_TYPE_ARRAY,
          "vocabulary source " + path + " has no tokenizer.ggml.tokens");
    return kv;
}

void set_hparams(gguf_context * out, const TinySpec & s, uint32_t n_vocab) {
    const std::string a = s.arch + ".";
    gguf_set_val_str(out, "general.architecture", s.arch.c_str());
    gguf_set_val_str(out, "general.name", ("kvlab tiny " + s.arch).c_str());
    gguf_set_val_u32(out, "general.file_type", file_type(s.weight_type));
    gguf_set_val_u32(out, (a + "vocab_size").c_str(), n_vocab);
    gguf_set_val_u32(out, (a + "context_length").c_str(), uint32_t(s.n_ctx_train));
    gguf_set_val_u32(out, (a + "embedding_length").c_str(), uint32_t(s.n_embd));
    gguf_set_val_u32(out, (a + "block_count").c_str(), uint32_t(s.n_layer));
    gguf_set_val_u32(out, (a + "feed_forward_length").c_str(), uint32_t(s.n_ff));
    gguf_set_val_u32(out, (a + "attention.head_count").c_str(), uint32_t(s.n_head));
    gguf_set_val_u32(out, (a + "attention.head_count_kv").c_str(), uint32_t(s.n_head_kv));
    gguf_set_val_u32(out, (a + "attention.key_length").c_str(), uint32_t(s.head_dim));
    gguf_set_val_u32(out, (a + "attention.value_length").c_str(), uint32_t(s.head_dim));
    gguf_set_val_u32(out, (a + "rope.dimension_count").c_str(), uint32_t(s.head_dim));
    gguf_set_val_f32(out, (a + "rope.freq_base").c_str(), s.rope_theta);
    gguf_set_val_f32(out, (a + "attention.layer_norm_rms_epsilon").c_str(), s.rms_eps);
}

}  // namespace

std::string write_tiny_gguf(const TinySpec & spec, const std::string & vocab_src, const std::string & out_path) {
    validate(spec);
    GgufPtr tok = tokenizer_kv(vocab_src);
    const auto n_vocab = uint32_t(gguf_get_arr_n(tok.get(), gguf_find_key(tok.get(), "tokenizer.ggml.tokens")));

    GgufPtr out(gguf_init_empty());
    set_hparams(out.get(), spec, n_vocab);
    gguf_set_kv(out.get(), tok.get());

    const std::vector<TensorPlan> plan = plan_tensors(spec, n_vocab);
    auto type_of = [&](const TensorPlan & t) { return t.kind == Kind::Matrix ? spec.weight_type : GGML_TYPE_F32; };
    size_t mem = 0;
    for (const auto & t : plan) mem += ggml_tensor_overhead() + ggml_row_size(type_of(t), t.ne0) * size_t(t.ne1);
    ggml_init_params params{};
    params.mem_size = mem + 1024;
    params.mem_buffer = nullptr;
    params.no_alloc = false;
    GgmlPtr ctx(ggml_init(params));
    check(ctx != nullptr, "cannot allocate " + std::to_string(mem) + " bytes for the tensors");

    Normal normal(spec.seed);
    for (const auto & t : plan) {
        ggml_tensor * x = t.ne1 == 1 ? ggml_new_tensor_1d(ctx.get(), type_of(t), t.ne0)
                                     : ggml_new_tensor_2d(ctx.get(), type_of(t), t.ne0, t.ne1);
        ggml_set_name(x, t.name.c_str());
        store(x, draw(t, normal));
        gguf_add_tensor(out.get(), x);
    }
    check(gguf_write_to_file(out.get(), out_path.c_str(), false), "cannot write " + out_path);
    return out_path;
}

std::string default_model_path() {
    std::string path;
    if (const char * env = std::getenv("KVLAB_TEST_MODEL"); env && *env) {
        path = env;
    } else {
        const char * home = std::getenv("HOME");
        path = std::string(home ? home : ".") + "/.cache/kvlab/models/smollm2-135m-0.1.2.gguf";
    }
    check(std::filesystem::exists(path),
          "test model " + path + " is missing; run scripts/models.sh smollm2-135m (or set KVLAB_TEST_MODEL)");
    return path;
}

}  // namespace kvlab::test
