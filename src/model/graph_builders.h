// Small graph builders that architectures compose into their graphs (as llama.cpp's
// llm_graph_context::build_norm / build_qkv / build_attn / build_ffn). Activations are
// F32 with the feature dim first: [n_embd, n_tokens], heads as [head_dim, n_heads, n_tokens].
// Intermediate tensors carry llama.cpp's names per layer ("attn_norm-3", "Kcur-3", "l_out-3"):
// the builders name their own, the architectures the rest, as llama.cpp's cb(cur, name, il).
#pragma once

#include "model/arch.h"

namespace kvlab::graph {

// Names t "<what>-<il>" (il < 0: "<what>"), as llama.cpp's cb(cur, what, il) does, so that a tensor
// of kvlab's graph and libllama's go by the same name (ggml_graph_get_tensor(gf, "attn_norm-3"))
// and a mismatch is located by name and layer. A kvlab node (GGML_OP_CUSTOM: a weight product, the
// attention) keeps its own name, which `kvlab profile` groups by and which names its weight and
// layer already ("product q8_0 blk.3.ffn_down.weight"). Names only; returns t.
ggml_tensor * name(ggml_tensor * t, const char * what, int il);

// The embedding table and the LM head every architecture loads: token_embd [n_embd, n_vocab],
// output_norm F32 [n_embd], output [n_embd, n_vocab] (token_embd itself when the file ties them);
// sets hp.n_vocab from the head. Errors name the file and the tensor.
struct EmbeddingsAndHead {
    ggml_tensor * tok_embd = nullptr;
    ggml_tensor * output_norm = nullptr;
    ggml_tensor * output = nullptr;
    bool tied() const { return output == tok_embd; }
};
EmbeddingsAndHead load_embeddings_and_head(const ModelReader & r, HParams & hp);

// The hyper-parameters every architecture built from these pieces reports (Architecture::describe):
// "n_ff", "rms_eps" and "tied_embeddings" (the LM head is the embedding table).
void describe_decoder(nlohmann::json & hparams, int32_t n_ff, float rms_eps, const EmbeddingsAndHead & e);

// Token embeddings: rows of tok_embd [n_embd, n_vocab] for g.in.tokens -> F32 [n_embd, n_tokens],
// named "inp_embd".
ggml_tensor * embed(const GraphContext & g, ggml_tensor * tok_embd);

// RMS normalisation over dim 0, times w: x F32 [n, ...], w F32 [n].
ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps);

// w x: w [n_in, n_out] (any type), x F32 [n_in, n_tokens] -> F32 [n_out, n_tokens]; ggml_mul_mat's
// result, computed by kvlab's kernels under g.products where they apply (kernels/products.h).
ggml_tensor * matmul(const GraphContext & g, ggml_tensor * w, ggml_tensor * x);

// w x (+ b): w [n_in, n_out] (any type), b F32 [n_out] or nullptr, x F32 [n_in, n_tokens]
// -> F32 [n_out, n_tokens].
ggml_tensor * linear(const GraphContext & g, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x);

struct QkvWeights {
    ggml_tensor * wq = nullptr;      // [n_embd, n_head*head_dim]
    ggml_tensor * wk = nullptr;      // [n_embd, n_head_kv*head_dim]
    ggml_tensor * wv = nullptr;      // [n_embd, n_head_kv*head_dim]
    ggml_tensor * bq = nullptr;      // F32 [n_head*head_dim], optional
    ggml_tensor * bk = nullptr;      // F32 [n_head_kv*head_dim], optional
    ggml_tensor * bv = nullptr;      // F32 [n_head_kv*head_dim], optional
    ggml_tensor * q_norm = nullptr;  // F32 [head_dim], optional RMS norm of each query head
    ggml_tensor * k_norm = nullptr;  // F32 [head_dim], optional RMS norm of each key head
};

// What a loader does with tensors an architecture may have: not look for them, take them when
// the file has them, or require them.
enum class Want { none, optional, required };

// Layer il's Q, K and V projections: attn_q.weight [n_embd, n_head*head_dim], attn_k.weight and
// attn_v.weight [n_embd, n_head_kv*head_dim]; then, as `biases` says, attn_q.bias, attn_k.bias and
// attn_v.bias (F32, their outputs' sizes), and as `qk_norm` says, the per-head norms
// attn_q_norm.weight and attn_k_norm.weight (F32 [head_dim]).
QkvWeights load_qkv(const ModelReader & r, const HParams & hp, int il, Want biases, Want qk_norm);

struct Qkv {
    ggml_tensor * x = nullptr;  // F32 [n_embd, n_tokens]: the (normed) input the projections read
    ggml_tensor * q = nullptr;  // F32 [head_dim, n_head, n_tokens]
    ggml_tensor * k = nullptr;  // F32 [head_dim, n_head_kv, n_tokens]
    ggml_tensor * v = nullptr;  // F32 [head_dim, n_head_kv, n_tokens]
};

// Q, K, V projections of x F32 [n_embd, n_tokens] with their optional biases, split into
// heads, then the optional per-head norms of Q and K (eps; named "Qcur_normed", "Kcur_normed"
// of layer il). Before RoPE: the architecture names Q, K and V ("Qcur", "Kcur", "Vcur") after it.
Qkv qkv(const GraphContext & g, const QkvWeights & w, ggml_tensor * x, float norm_eps, int il);

// RoPE (g.hp's parameters; layer il's base: rope_theta, or rope_theta_swa on a sliding
// layer) of x F32 [head_dim, n_heads, n_tokens] at g.in.pos; freq_factors F32 [n_rot/2] or nullptr.
ggml_tensor * rope(const GraphContext & g, ggml_tensor * x, ggml_tensor * freq_factors, int il);

// The attention's input in a pre-norm block: the RMS norm of the residual x (attn_norm F32
// [n_embd], eps; named "attn_norm"), Q, K and V (qkv, per-head norms at eps), RoPE on Q and K
// (freq_factors as rope's); Q, K and V named "Qcur", "Kcur", "Vcur" (of layer il).
Qkv attention_input(const GraphContext & g, ggml_tensor * x, ggml_tensor * attn_norm, const QkvWeights & w, float eps,
                    ggml_tensor * freq_factors, int il);

// Attention of layer il over the KV store (through the engine's g.attention; the new
// keys and values are appended to the store) and the output projection wo
// [n_head*head_dim, n_embd] with optional bias bo F32 [n_embd] -> F32 [n_embd, n_tokens]. The
// attention's result is named "kqv_out", the projection's "attn_out" (of layer il).
ggml_tensor * attention(const GraphContext & g, int il, const Qkv & qkv, ggml_tensor * wo, ggml_tensor * bo = nullptr);

struct FfnWeights {
    ggml_tensor * gate = nullptr;  // [n_embd, n_ff]
    ggml_tensor * up = nullptr;    // [n_embd, n_ff]
    ggml_tensor * down = nullptr;  // [n_ff, n_embd]
};

// Layer il's gated FFN: ffn_gate.weight and ffn_up.weight [n_embd, n_ff], ffn_down.weight [n_ff, n_embd].
FfnWeights load_ffn(const ModelReader & r, const HParams & hp, int il, int64_t n_ff);

// down(silu(gate x) * up x): x F32 [n_embd, n_tokens] -> F32 [n_embd, n_tokens]. Names
// "ffn_up", "ffn_gate", "ffn_swiglu" of layer il; the architecture names the result.
ggml_tensor * ffn_silu_gated(const GraphContext & g, const FfnWeights & w, ggml_tensor * x, int il);

// down(gelu(gate x) * up x), GELU's tanh approximation (ggml_geglu_split, as llama.cpp's
// LLM_FFN_GELU with a parallel gate): x F32 [n_embd, n_tokens] -> F32 [n_embd, n_tokens]. Names
// "ffn_up", "ffn_gate", "ffn_geglu" of layer il; the architecture names the result.
ggml_tensor * ffn_gelu_gated(const GraphContext & g, const FfnWeights & w, ggml_tensor * x, int il);

// Only the rows of x F32 [n, n_tokens] whose logits are wanted (g.in.out_ids): the last
// layer applies it to its residual and attention output, so its FFN and the head see
// n_out rows. x itself when there are no out_ids.
ggml_tensor * output_rows(const GraphContext & g, ggml_tensor * x);

// Final RMS norm (norm F32 [n_embd], eps) and LM head w_out [n_embd, n_vocab]; with
// softcap > 0 the logits become softcap * tanh(logits / softcap). Expands g.gf up to the
// logits F32 [n_vocab, n_out] and returns them. Names "result_norm" and "result_output".
ggml_tensor * lm_head(const GraphContext & g, ggml_tensor * x, ggml_tensor * norm, float eps, ggml_tensor * w_out,
                      float softcap = 0.0f);

}  // namespace kvlab::graph
