// Architecture `gemma3`: Gemma 3 (text), as llama.cpp's src/models/gemma3.cpp. Sliding-window
// layers (a query sees the last n_swa positions; RoPE base rope.freq_base_swa, 10,000 when
// absent) interleaved with global ones (rope.freq_base): every n-th layer is global, n from
// attention.sliding_window_pattern (6 when absent), or the pattern is a per-layer array.
// Each block: RMS norm, Q/K/V, per-head RMS norms of Q and K, RoPE, Q scaled by
// 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) on the 62-layer 27B, as gemma_pytorch's
// query_pre_attn_scalar), the output projection, a post-attention RMS norm, the residual;
// RMS norm, GELU-gated FFN, a post-FFN RMS norm, the residual. Embeddings scaled by
// sqrt(n_embd); optional final logit soft-capping. The GGUF's norm weights already hold
// Gemma's (1 + w).
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "gguf.h"
#include "model/arch.h"
#include "model/graph_builders.h"

namespace kvlab {
namespace {

struct Gemma3Layer {
    ggml_tensor * attn_norm = nullptr;       // F32 [n_embd]
    graph::QkvWeights attn;                  // Q, K, V and the per-head norms of Q and K
    ggml_tensor * wo = nullptr;              // [n_head*head_dim, n_embd]
    ggml_tensor * attn_post_norm = nullptr;  // F32 [n_embd]
    ggml_tensor * ffn_norm = nullptr;        // F32 [n_embd]
    graph::FfnWeights ffn;                   // gate, up [n_embd, n_ff]; down [n_ff, n_embd]
    ggml_tensor * ffn_post_norm = nullptr;   // F32 [n_embd]
};

// Which layers slide: the GGUF's per-layer array, or every layer but each n-th (llama.cpp's
// set_swa_pattern: layer il slides when il % n < n - 1; n == 0: all of them).
std::vector<uint8_t> swa_pattern(const ModelReader & r, int n_layer) {
    const std::string key = r.key("attention.sliding_window_pattern");
    const int64_t id = gguf_find_key(r.gguf(), key.c_str());
    std::vector<uint8_t> out(size_t(n_layer), 0);
    if (id >= 0 && gguf_get_kv_type(r.gguf(), id) == GGUF_TYPE_ARRAY) {
        if (gguf_get_arr_type(r.gguf(), id) != GGUF_TYPE_BOOL || gguf_get_arr_n(r.gguf(), id) < size_t(n_layer))
            r.fail(key + " must be an array of at least block_count booleans");
        const auto * v = static_cast<const int8_t *>(gguf_get_arr_data(r.gguf(), id));
        for (int il = 0; il < n_layer; ++il) out[size_t(il)] = v[il] != 0;
        return out;
    }
    const int32_t n = r.get_int(key, 6, 0, 1 << 16);
    for (int il = 0; il < n_layer; ++il) out[size_t(il)] = n == 0 || il % n < n - 1;
    return out;
}

class Gemma3 final : public Architecture {
public:
    void load(const ModelReader & r, HParams & hp) override {
        hp.rope_mode = GGML_ROPE_TYPE_NEOX;
        using Role = ModelReader::Role;
        constexpr Role mat = Role::matrix, vec = Role::vector;
        n_ff_ = r.required_int(r.key("feed_forward_length"), 1, 1 << 20);
        rms_eps_ = r.get_float(r.key("attention.layer_norm_rms_epsilon"), 1e-6f, 1e-12f, 1.0f);
        softcap_ = r.get_float(r.key("final_logit_softcapping"), 0.0f, 0.0f, 1e6f);
        hp.n_swa = r.get_int(r.key("attention.sliding_window"), 0, 0, INT32_MAX);
        if (hp.n_swa > 0) {
            hp.swa_layers = swa_pattern(r, hp.n_layer);
            hp.rope_theta_swa = r.get_float(r.key("rope.freq_base_swa"), 10000.0f, 1e-3f, 1e12f);
        }
        // gemma_pytorch's query_pre_attn_scalar: n_embd / n_head on the 27B, head_dim elsewhere;
        // applied to Q in the graph (llama.cpp's order of operations), the attention's own scale 1
        q_scale_ =
            hp.n_layer == 62 ? 1.0f / std::sqrt(float(hp.n_embd / hp.n_head)) : 1.0f / std::sqrt(float(hp.head_dim));
        hp.attn_scale = 1.0f;

        const int64_t n_embd = hp.n_embd, n_q = int64_t(hp.n_head) * hp.head_dim;
        head_ = graph::load_embeddings_and_head(r, hp);

        layers_.resize(hp.n_layer);
        for (int il = 0; il < hp.n_layer; ++il) {
            Gemma3Layer & l = layers_[il];
            l.attn_norm = r.required_layer(il, "attn_norm.weight", {n_embd}, vec);
            l.attn = graph::load_qkv(r, hp, il, graph::Want::none, graph::Want::required);
            l.wo = r.required_layer(il, "attn_output.weight", {n_q, n_embd}, mat);
            l.attn_post_norm = r.required_layer(il, "post_attention_norm.weight", {n_embd}, vec);
            l.ffn_norm = r.required_layer(il, "ffn_norm.weight", {n_embd}, vec);
            l.ffn = graph::load_ffn(r, hp, il, n_ff_);
            l.ffn_post_norm = r.required_layer(il, "post_ffw_norm.weight", {n_embd}, vec);
        }
    }

    ggml_tensor * build_graph(const GraphContext & g) const override {
        ggml_context * ctx = g.ctx;
        const int n_layer = int(layers_.size());
        ggml_tensor * x = graph::name(ggml_scale(ctx, graph::embed(g, head_.tok_embd), std::sqrt(float(g.hp.n_embd))),
                                      "inp_scaled", -1);
        for (int il = 0; il < n_layer; ++il) {
            const Gemma3Layer & l = layers_[il];
            graph::Qkv a = graph::attention_input(g, x, l.attn_norm, l.attn, rms_eps_, nullptr, il);
            a.q = ggml_scale(ctx, a.q, q_scale_);
            ggml_tensor * o = graph::attention(g, il, a, l.wo);  // F32 [n_embd, n_tokens]
            if (il == n_layer - 1) {
                o = graph::output_rows(g, o);
                x = graph::output_rows(g, x);
            }
            o = graph::name(graph::rms_norm(ctx, o, l.attn_post_norm, rms_eps_), "attn_post_norm", il);
            x = graph::name(ggml_add(ctx, x, o), "sa_out", il);
            ggml_tensor * h = graph::name(graph::rms_norm(ctx, x, l.ffn_norm, rms_eps_), "ffn_norm", il);
            ggml_tensor * f = graph::name(graph::ffn_gelu_gated(g, l.ffn, h, il), "ffn_out", il);
            f = graph::name(graph::rms_norm(ctx, f, l.ffn_post_norm, rms_eps_), "ffn_post_norm", il);
            x = graph::name(ggml_add(ctx, x, f), "l_out", il);
        }
        return graph::lm_head(g, x, head_.output_norm, rms_eps_, head_.output, softcap_);
    }

    const ggml_tensor * attn_output(int il) const override { return layers_.at(size_t(il)).wo; }

    void describe(nlohmann::json & hparams) const override {
        graph::describe_decoder(hparams, n_ff_, rms_eps_, head_);
        hparams["final_logit_softcapping"] = softcap_;
    }

private:
    int32_t n_ff_ = 0;
    float rms_eps_ = 1e-6f;
    float softcap_ = 0.0f;
    float q_scale_ = 1.0f;
    graph::EmbeddingsAndHead head_;    // token_embd, output_norm, output (== token_embd when tied)
    std::vector<Gemma3Layer> layers_;  // [n_layer]
};

const ArchRegistrar registrar("gemma3", [] { return std::unique_ptr<Architecture>(std::make_unique<Gemma3>()); });

}  // namespace
}  // namespace kvlab
