// The architecture plug-in seam, as llama.cpp's src/models/<arch>.cpp: one file per
// architecture registers a factory under the GGUF's general.architecture name. The
// instance made for a model reads the architecture's own hyper-parameters, looks up and
// owns (pointers to) its weights, and builds its graph from the shared builders
// (graph_builders.h). The llama family (llama_family.h) is the default composition.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ggml.h"
#include "kernels/scratch.h"
#include "kvlab/model.h"

namespace kvlab {

// A GGUF being loaded: metadata by key and tensors by name; errors name the file.
class ModelReader {
public:
    ModelReader(const gguf_context * gguf, ggml_context * ctx, std::string path, std::string arch)
        : gguf_(gguf), ctx_(ctx), path_(std::move(path)), arch_(std::move(arch)) {}
    const std::string & path() const { return path_; }
    const gguf_context * gguf() const { return gguf_; }
    // "<arch>.<suffix>", the key of an architecture's hyper-parameter.
    std::string key(const std::string & suffix) const { return arch_ + "." + suffix; }

    // A numeric value of any GGUF integer or float type; false when absent.
    bool number(const std::string & key, double & out) const;
    // Integers must be whole numbers in [lo, hi], floats finite and in [lo, hi]; a value out
    // of range is an error naming the key (a crafted file must not reach ggml's asserts).
    int32_t required_int(const std::string & key, int32_t lo, int32_t hi) const;  // throws when absent
    int32_t get_int(const std::string & key, int32_t fallback, int32_t lo, int32_t hi) const;
    float get_float(const std::string & key, float fallback, float lo, float hi) const;
    std::string get_string(const std::string & key) const;  // "" when absent or not a string

    // A tensor's role decides the types it may have: a matrix is the weight of a product or a
    // table of rows (any type ggml's CPU backend multiplies and converts to F32); a vector
    // (norm, bias, RoPE factors) is F32, as ggml's element-wise operations need.
    enum class Role { matrix, vector };
    // The tensor `name` checked against the architecture before any graph sees it: shape
    // (ne[0], ne[1], ...; -1 for a dimension the architecture leaves free, trailing
    // dimensions 1) and type for its role. Errors name the file, the tensor and what differs.
    ggml_tensor * required(const std::string & name, std::vector<int64_t> shape, Role role) const;
    ggml_tensor * optional(const std::string & name, std::vector<int64_t> shape, Role role) const;
    // "blk.<il>.<suffix>"
    ggml_tensor * required_layer(int il, const std::string & suffix, std::vector<int64_t> shape, Role role) const;
    ggml_tensor * optional_layer(int il, const std::string & suffix, std::vector<int64_t> shape, Role role) const;

    [[noreturn]] void fail(const std::string & what) const;  // Error("model", "<path>: what")

private:
    const gguf_context * gguf_;
    ggml_context * ctx_;
    std::string path_;
    std::string arch_;
};

// Attention over the KV store for layer il, supplied by the engine.
// q: F32 [head_dim, n_head, n_tokens] (post-RoPE); k, v: F32 [head_dim, n_head_kv, n_tokens]
// (k post-RoPE); x: F32 [n_embd, n_tokens], the hidden state entering the attention (after
// its norm: what the projections read). Returns F32 [n_head*head_dim, n_tokens].
using AttentionFn =
    std::function<ggml_tensor *(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * x)>;

struct GraphInputs {
    ggml_tensor * tokens = nullptr;   // I32 [n_tokens]
    ggml_tensor * pos = nullptr;      // I32 [n_tokens]: absolute positions
    ggml_tensor * out_ids = nullptr;  // I32 [n_out]: rows whose logits are computed
};

// What a graph is built with: the context its nodes live in (no data), the graph, the
// model's hyper-parameters and products' arithmetic, the engine's inputs and its attention
// over the KV store.
struct GraphContext {
    ggml_context * ctx;
    ggml_cgraph * gf;
    const HParams & hp;
    Products products;
    GraphInputs in;
    const AttentionFn & attention;
    const std::unordered_set<const ggml_tensor *> * panels = nullptr;  // Model::panels()
    kernels::GraphScratch & scratch;  // the graph's, which kvlab's nodes take their threads' memory from
    int64_t n_tokens() const { return in.tokens->ne[0]; }
};

class Architecture {
public:
    virtual ~Architecture() = default;
    // Reads the architecture's own hyper-parameters (hp holds the common ones; the
    // architecture completes them: RoPE mode, n_vocab from the LM head) and looks up its
    // tensors. Throws kvlab::Error naming the file and the problem.
    virtual void load(const ModelReader & r, HParams & hp) = 0;
    // Adds the forward pass over g.in.tokens to g.gf: F32 logits [n_vocab, n_out].
    virtual ggml_tensor * build_graph(const GraphContext & g) const = 0;
    // What methods above the model read (Model::attn_output, Model::rope_freq_factors).
    virtual const ggml_tensor * attn_output(int il) const = 0;
    virtual const ggml_tensor * rope_freq_factors() const { return nullptr; }
    // Adds the architecture's own hyper-parameters to a provenance record's "hparams".
    virtual void describe(nlohmann::json & hparams) const = 0;
};

using ArchFactory = std::unique_ptr<Architecture> (*)();
struct ArchEntry {
    std::string name;  // general.architecture
    ArchFactory make;
};

void register_architecture(const std::string & name, ArchFactory make);
const ArchEntry * find_architecture(const std::string & name);  // nullptr when unknown
std::vector<std::string> architecture_names();

// Registers an architecture at static-initialisation time:
//   const ArchRegistrar registrar("llama", [] { return make_llama_family({}); });
struct ArchRegistrar {
    ArchRegistrar(const std::string & name, ArchFactory make) { register_architecture(name, make); }
};

}  // namespace kvlab
