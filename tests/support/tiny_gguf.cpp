#include "support/tiny_gguf.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ggml-cpp.h"
#include "gguf.h"
#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "kvlab/text.h"
#include "llama.h"
#include "support/fixtures.h"

namespace kvlab::test {
namespace {

constexpr const char * k_component = "tiny_gguf";
constexpr float k_noise = 0.05f;  // std of the noise on norms (around 1) and of biases (around 0)

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

// Widths a tensor dimension can take, from the spec.
enum class Width { embd, head, q, kv };  // n_embd, head_dim, n_head*head_dim, n_head_kv*head_dim

// A per-layer vector an architecture adds to the llama layout, right after the layer's
// tensor `after` (a suffix of the llama layout, in plan_tensors).
struct ExtraTensor {
    const char * after;
    const char * suffix;
    Kind kind;
    Width ne0;
};

// The tiny-model spec of each architecture: what it adds to the llama layout (llama.cpp's
// src/models/<arch>.cpp loader) in tensors and "<arch>." metadata. Adding an architecture
// adds its row.
struct ArchLayout {
    const char * arch;
    std::vector<ExtraTensor> layer_extra;  // in file order
    bool q_is_embd = false;                // llama.cpp's loader needs n_head * head_dim == n_embd
    std::vector<std::pair<const char *, uint32_t>> u32_keys = {};
    std::vector<std::pair<const char *, float>> f32_keys = {};
};

const std::vector<ArchLayout> & layouts() {
    static const std::vector<ArchLayout> l = {
        {"llama", {}},
        {"qwen2",
         {{"attn_v.weight", "attn_q.bias", Kind::Bias, Width::q},
          {"attn_v.weight", "attn_k.bias", Kind::Bias, Width::kv},
          {"attn_v.weight", "attn_v.bias", Kind::Bias, Width::kv}},
         true},
        {"qwen3",
         {{"attn_v.weight", "attn_q_norm.weight", Kind::Norm, Width::head},
          {"attn_v.weight", "attn_k_norm.weight", Kind::Norm, Width::head}}},
        // sliding window from TinySpec::sliding_window; every 6th layer global (no pattern key);
        // the sliding layers' RoPE base differs from the global one
        {"gemma3",
         {{"attn_v.weight", "attn_q_norm.weight", Kind::Norm, Width::head},
          {"attn_v.weight", "attn_k_norm.weight", Kind::Norm, Width::head},
          {"attn_output.weight", "post_attention_norm.weight", Kind::Norm, Width::embd},
          {"ffn_down.weight", "post_ffw_norm.weight", Kind::Norm, Width::embd}},
         false,
         {},
         {{"rope.freq_base_swa", 1000.0f}}},
    };
    return l;
}

const ArchLayout * find_layout(const std::string & arch) {
    for (const auto & l : layouts())
        if (arch == l.arch) return &l;
    return nullptr;
}

void validate(const TinySpec & s) {
    const ArchLayout * layout = find_layout(s.arch);
    std::string known;
    for (const auto & l : layouts()) known += (known.empty() ? "" : ", ") + std::string(l.arch);
    check(layout != nullptr, "unsupported arch '" + s.arch + "' (" + known + ")");
    check(s.n_layer > 0 && s.n_embd > 0 && s.n_head > 0 && s.n_head_kv > 0 && s.head_dim > 0 && s.n_ff > 0 &&
              s.n_ctx_train > 0,
          "every size of the spec must be positive");
    check(s.n_head % s.n_head_kv == 0, "n_head must be a multiple of n_head_kv");
    check(s.head_dim % 2 == 0, "head_dim must be even (RoPE rotates pairs)");
    if (layout->q_is_embd) {
        check(s.n_head * s.head_dim == s.n_embd, s.arch + " in llama.cpp needs n_head * head_dim == n_embd");
    }
    check(s.weight_type == GGML_TYPE_F32 || s.weight_type == GGML_TYPE_F16 || s.weight_type == GGML_TYPE_Q8_0,
          std::string("weight_type must be F32, F16 or Q8_0, not ") + ggml_type_name(s.weight_type));
    const int64_t blck = ggml_blck_size(s.weight_type);
    check(s.n_embd % blck == 0 && s.n_ff % blck == 0 && (s.n_head * s.head_dim) % blck == 0,
          "n_embd, n_ff and n_head * head_dim must be multiples of " + std::to_string(blck) + " for " +
              ggml_type_name(s.weight_type));
}

// Every tensor llama.cpp's loader creates for the arch, in file order.
std::vector<TensorPlan> plan_tensors(const TinySpec & s, int64_t n_vocab) {
    const int64_t n_q = int64_t(s.n_head) * s.head_dim;      // query width
    const int64_t n_kv = int64_t(s.n_head_kv) * s.head_dim;  // key / value width
    auto width = [&](Width w) -> int64_t {
        switch (w) {
            case Width::embd:
                return s.n_embd;
            case Width::head:
                return s.head_dim;
            case Width::q:
                return n_q;
            case Width::kv:
                return n_kv;
        }
        return 0;
    };
    // the llama layout of one layer
    const std::vector<TensorPlan> layer = {
        {"attn_norm.weight", Kind::Norm, s.n_embd, 1},       {"attn_q.weight", Kind::Matrix, s.n_embd, n_q},
        {"attn_k.weight", Kind::Matrix, s.n_embd, n_kv},     {"attn_v.weight", Kind::Matrix, s.n_embd, n_kv},
        {"attn_output.weight", Kind::Matrix, n_q, s.n_embd}, {"ffn_norm.weight", Kind::Norm, s.n_embd, 1},
        {"ffn_gate.weight", Kind::Matrix, s.n_embd, s.n_ff}, {"ffn_up.weight", Kind::Matrix, s.n_embd, s.n_ff},
        {"ffn_down.weight", Kind::Matrix, s.n_ff, s.n_embd},
    };
    const std::vector<ExtraTensor> & extra = find_layout(s.arch)->layer_extra;
    std::vector<TensorPlan> p;
    p.push_back({"token_embd.weight", Kind::Matrix, s.n_embd, n_vocab});
    for (int il = 0; il < s.n_layer; ++il) {
        const std::string b = "blk." + std::to_string(il) + ".";
        for (const TensorPlan & t : layer) {
            p.push_back({b + t.name, t.kind, t.ne0, t.ne1});
            for (const ExtraTensor & e : extra)
                if (t.name == e.after) p.push_back({b + e.suffix, e.kind, width(e.ne0), 1});
        }
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

// kv's token table cut to its first n tokens: their types and scores, and the merges whose
// two halves and result are all kept.
void keep_first_tokens(gguf_context * kv, uint32_t n) {
    const int64_t tokens = gguf_find_key(kv, "tokenizer.ggml.tokens");
    std::vector<std::string> kept;
    for (uint32_t i = 0; i < n && i < gguf_get_arr_n(kv, tokens); ++i) kept.push_back(gguf_get_arr_str(kv, tokens, i));
    const std::unordered_set<std::string> known(kept.begin(), kept.end());
    std::vector<const char *> ptrs;
    for (const auto & t : kept) ptrs.push_back(t.c_str());
    gguf_set_arr_str(kv, "tokenizer.ggml.tokens", ptrs.data(), int(ptrs.size()));
    for (const char * key : {"tokenizer.ggml.token_type", "tokenizer.ggml.scores"}) {
        const int64_t k = gguf_find_key(kv, key);
        if (k < 0) continue;
        const gguf_type t = gguf_get_arr_type(kv, k);
        const std::vector<char> head(static_cast<const char *>(gguf_get_arr_data(kv, k)),
                                     static_cast<const char *>(gguf_get_arr_data(kv, k)) + 4 * size_t(kept.size()));
        gguf_set_arr_data(kv, key, t, head.data(), kept.size());
    }
    const int64_t merges = gguf_find_key(kv, "tokenizer.ggml.merges");
    if (merges < 0) return;
    std::vector<std::string> keep;
    for (size_t i = 0; i < gguf_get_arr_n(kv, merges); ++i) {
        const std::string m = gguf_get_arr_str(kv, merges, i);
        const size_t sp = m.find(' ');
        if (sp != std::string::npos && known.count(m.substr(0, sp)) && known.count(m.substr(sp + 1)) &&
            known.count(m.substr(0, sp) + m.substr(sp + 1)))
            keep.push_back(m);
    }
    ptrs.clear();
    for (const auto & m : keep) ptrs.push_back(m.c_str());
    gguf_set_arr_str(kv, "tokenizer.ggml.merges", ptrs.data(), int(ptrs.size()));
}

// The tokenizer.* keys of the GGUF at path, in a context of their own.
gguf_context_ptr tokenizer_kv(const std::string & path) {
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx = nullptr;
    gguf_context_ptr src(gguf_init_from_file(path.c_str(), params));
    check(src != nullptr, "cannot read GGUF metadata of vocabulary source " + path);
    gguf_context_ptr kv(gguf_init_empty());
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
    const ArchLayout * layout = find_layout(s.arch);
    for (const auto & [key, v] : layout->u32_keys) gguf_set_val_u32(out, (a + key).c_str(), v);
    if (s.sliding_window > 0)
        gguf_set_val_u32(out, (a + "attention.sliding_window").c_str(), uint32_t(s.sliding_window));
    for (const auto & [key, v] : layout->f32_keys) gguf_set_val_f32(out, (a + key).c_str(), v);
}

}  // namespace

std::string write_tiny_gguf(const TinySpec & spec, const std::string & vocab_src, const std::string & out_path) {
    validate(spec);
    gguf_context_ptr tok = tokenizer_kv(vocab_src);
    if (spec.vocab_size > 0) keep_first_tokens(tok.get(), uint32_t(spec.vocab_size));
    const auto n_vocab = uint32_t(gguf_get_arr_n(tok.get(), gguf_find_key(tok.get(), "tokenizer.ggml.tokens")));

    gguf_context_ptr out(gguf_init_empty());
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
    ggml_context_ptr ctx(ggml_init(params));
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

TinyModel::~TinyModel() {
    model.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
}

std::unique_ptr<TinyModel> load_tiny_model(const TinySpec & spec, const std::string & tag, size_t n_tokens) {
    auto t = std::make_unique<TinyModel>();
    t->dir = temp_dir(tag);
    const std::string path = write_tiny_gguf(spec, default_model_path(), t->dir + "/tiny.gguf");
    t->model = Model::load(path, {.n_threads = 2});
    t->tokens = Tokenizer(path).encode(test_text("avg.txt"));
    t->tokens.resize(n_tokens);
    return t;
}

ParamMap method_test_params(const std::string & method, const Model & model, const std::string & dir) {
    if (method != "kvzap") return {};
    const std::string path = dir + "/" + model.file_sha256().substr(0, 16) + "-random.kvzap";
    if (!std::filesystem::exists(path)) {
        const HParams & hp = model.hparams();
        std::mt19937_64 rng(7);
        std::normal_distribution<float> nd(0.0f, 0.3f);
        std::vector<Surrogate::Layer> layers(static_cast<size_t>(hp.n_layer));
        for (auto & l : layers) {
            for (int i = 0; i < hp.n_head_kv * hp.n_embd; ++i) l.w1.push_back(nd(rng));
            l.b1.assign(static_cast<size_t>(hp.n_head_kv), 0.0f);
        }
        Surrogate s(Surrogate::Kind::linear, hp.n_embd, hp.n_head_kv, 0, std::move(layers));
        s.model = {{"name", "test"}, {"sha256", model.file_sha256()}, {"arch", hp.arch}};
        s.save(path);
    }
    return {{"scorer", path}};
}

}  // namespace kvlab::test
