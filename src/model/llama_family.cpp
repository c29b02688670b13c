#include "model/llama_family.h"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "model/graph_builders.h"

namespace kvlab {
namespace {

struct LlamaLayer {
    ggml_tensor * attn_norm = nullptr;  // F32 [n_embd]
    graph::QkvWeights attn;             // Q, K, V with the options' biases and norms
    ggml_tensor * wo = nullptr;         // [n_head*head_dim, n_embd]
    ggml_tensor * ffn_norm = nullptr;   // F32 [n_embd]
    graph::FfnWeights ffn;              // gate, up [n_embd, n_ff]; down [n_ff, n_embd]
};

class LlamaFamily final : public Architecture {
public:
    explicit LlamaFamily(const LlamaOptions & opts) : opts_(opts) {}

    void load(const ModelReader & r, HParams & hp) override {
        hp.rope_mode = opts_.rope_mode;
        using Role = ModelReader::Role;
        constexpr Role mat = Role::matrix, vec = Role::vector;
        n_ff_ = r.required_int(r.key("feed_forward_length"), 1, 1 << 20);
        rms_eps_ = r.get_float(r.key("attention.layer_norm_rms_epsilon"), 1e-5f, 1e-12f, 1.0f);
        sliding_window_ = r.get_int(r.key("attention.sliding_window"), 0, 0, INT32_MAX);
        if (sliding_window_ > 0) r.fail("sliding-window attention is not supported yet");

        const int64_t n_embd = hp.n_embd, n_q = int64_t(hp.n_head) * hp.head_dim;
        head_ = graph::load_embeddings_and_head(r, hp);
        rope_freqs_ = r.optional("rope_freqs.weight", {hp.n_rot / 2}, vec);

        layers_.resize(hp.n_layer);
        for (int il = 0; il < hp.n_layer; ++il) {
            LlamaLayer & l = layers_[il];
            l.attn_norm = r.required_layer(il, "attn_norm.weight", {n_embd}, vec);
            l.attn = graph::load_qkv(r, hp, il, opts_.qkv_bias ? graph::Want::required : graph::Want::optional,
                                     opts_.qk_norm ? graph::Want::required : graph::Want::none);
            l.wo = r.required_layer(il, "attn_output.weight", {n_q, n_embd}, mat);
            l.ffn_norm = r.required_layer(il, "ffn_norm.weight", {n_embd}, vec);
            l.ffn = graph::load_ffn(r, hp, il, n_ff_);
        }
    }

    ggml_tensor * build_graph(const GraphContext & g) const override {
        ggml_context * ctx = g.ctx;
        const int n_layer = int(layers_.size());
        ggml_tensor * x = graph::embed(g, head_.tok_embd);  // F32 [n_embd, n_tokens]
        for (int il = 0; il < n_layer; ++il) {
            const LlamaLayer & l = layers_[il];
            const graph::Qkv a = graph::attention_input(g, x, l.attn_norm, l.attn, rms_eps_, rope_freqs_, il);
            ggml_tensor * o = graph::attention(g, il, a, l.wo);  // F32 [n_embd, n_tokens]
            if (il == n_layer - 1) {
                // only the rows whose logits are wanted go through the last FFN and the head
                o = graph::output_rows(g, o);
                x = graph::output_rows(g, x);
            }
            x = graph::name(ggml_add(ctx, x, o), "ffn_inp", il);
            ggml_tensor * h = graph::name(graph::rms_norm(ctx, x, l.ffn_norm, rms_eps_), "ffn_norm", il);
            ggml_tensor * f = graph::name(graph::ffn_silu_gated(g, l.ffn, h, il), "ffn_out", il);
            x = graph::name(ggml_add(ctx, x, f), "l_out", il);
        }
        return graph::lm_head(g, x, head_.output_norm, rms_eps_, head_.output);
    }

    const ggml_tensor * attn_output(int il) const override { return layers_.at(size_t(il)).wo; }
    const ggml_tensor * rope_freq_factors() const override { return rope_freqs_; }

    void describe(nlohmann::json & hparams) const override {
        graph::describe_decoder(hparams, n_ff_, rms_eps_, head_);
        hparams["sliding_window"] = sliding_window_;
    }

private:
    LlamaOptions opts_;
    int32_t n_ff_ = 0;
    float rms_eps_ = 1e-5f;
    int32_t sliding_window_ = 0;          // 0: none (the only value loaded)
    graph::EmbeddingsAndHead head_;       // token_embd, output_norm, output (== token_embd when tied)
    ggml_tensor * rope_freqs_ = nullptr;  // F32 [n_rot/2] (Llama 3 RoPE scaling), optional
    std::vector<LlamaLayer> layers_;      // [n_layer]
};

}  // namespace

std::unique_ptr<Architecture> make_llama_family(const LlamaOptions & opts) {
    return std::make_unique<LlamaFamily>(opts);
}

}  // namespace kvlab
