#include "model/graph_builders.h"

#include <array>
#include <nlohmann/json.hpp>

#include "kernels/products.h"

namespace kvlab::graph {

ggml_tensor * name(ggml_tensor * t, const char * what, int il) {
    if (t->op == GGML_OP_CUSTOM) return t;  // kvlab's node: its own name (kvlab profile reads it)
    return il >= 0 ? ggml_format_name(t, "%s-%d", what, il) : ggml_set_name(t, what);
}

ggml_tensor * matmul(const GraphContext & g, ggml_tensor * w, ggml_tensor * x) {
    return kernels::mul_mat(g.ctx, g.products, g.scratch, w, x, g.panels);
}

namespace {

// w_i x for each weight; x packed once when one kernel runs every product.
template <size_t N>
std::array<ggml_tensor *, N> matmuls(const GraphContext & g, const std::array<ggml_tensor *, N> & w, ggml_tensor * x) {
    std::array<ggml_tensor *, N> out;
    kernels::mul_mats(g.ctx, g.products, g.scratch, w.data(), out.data(), int(N), x, g.panels);
    return out;
}

ggml_tensor * add_bias(ggml_context * ctx, ggml_tensor * y, ggml_tensor * b) {
    return b ? ggml_add(ctx, y, b) : y;
}

}  // namespace

EmbeddingsAndHead load_embeddings_and_head(const ModelReader & r, HParams & hp) {
    using Role = ModelReader::Role;
    EmbeddingsAndHead e;
    e.tok_embd = r.required("token_embd.weight", {hp.n_embd, -1}, Role::matrix);
    e.output_norm = r.required("output_norm.weight", {hp.n_embd}, Role::vector);
    e.output = r.optional("output.weight", {hp.n_embd, e.tok_embd->ne[1]}, Role::matrix);
    if (!e.output) e.output = e.tok_embd;
    if (e.tok_embd->ne[1] > INT32_MAX) r.fail("token_embd has more rows than token ids can name");
    hp.n_vocab = int32_t(e.output->ne[1]);
    return e;
}

void describe_decoder(nlohmann::json & hparams, int32_t n_ff, float rms_eps, const EmbeddingsAndHead & e) {
    hparams["n_ff"] = n_ff;
    hparams["rms_eps"] = rms_eps;
    hparams["tied_embeddings"] = e.tied();
}

ggml_tensor * embed(const GraphContext & g, ggml_tensor * tok_embd) {
    return name(kernels::get_rows(g.ctx, tok_embd, g.in.tokens, g.panels), "inp_embd", -1);
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * linear(const GraphContext & g, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) {
    return add_bias(g.ctx, matmul(g, w, x), b);
}

QkvWeights load_qkv(const ModelReader & r, const HParams & hp, int il, Want biases, Want qk_norm) {
    using Role = ModelReader::Role;
    const int64_t n_embd = hp.n_embd, n_q = int64_t(hp.n_head) * hp.head_dim;
    const int64_t n_kv = int64_t(hp.n_head_kv) * hp.head_dim;
    const auto vec = [&](Want want, const char * suffix, int64_t n) -> ggml_tensor * {
        if (want == Want::none) return nullptr;
        return want == Want::required ? r.required_layer(il, suffix, {n}, Role::vector)
                                      : r.optional_layer(il, suffix, {n}, Role::vector);
    };
    QkvWeights w;
    w.wq = r.required_layer(il, "attn_q.weight", {n_embd, n_q}, Role::matrix);
    w.wk = r.required_layer(il, "attn_k.weight", {n_embd, n_kv}, Role::matrix);
    w.wv = r.required_layer(il, "attn_v.weight", {n_embd, n_kv}, Role::matrix);
    w.bq = vec(biases, "attn_q.bias", n_q);
    w.bk = vec(biases, "attn_k.bias", n_kv);
    w.bv = vec(biases, "attn_v.bias", n_kv);
    w.q_norm = vec(qk_norm, "attn_q_norm.weight", hp.head_dim);
    w.k_norm = vec(qk_norm, "attn_k_norm.weight", hp.head_dim);
    return w;
}

Qkv qkv(const GraphContext & g, const QkvWeights & w, ggml_tensor * x, float norm_eps, int il) {
    const HParams & hp = g.hp;
    const int64_t n = g.n_tokens();
    Qkv r;
    r.x = x;
    const auto [q, k, v] = matmuls<3>(g, {w.wq, w.wk, w.wv}, x);
    r.q = ggml_reshape_3d(g.ctx, add_bias(g.ctx, q, w.bq), hp.head_dim, hp.n_head, n);
    r.k = ggml_reshape_3d(g.ctx, add_bias(g.ctx, k, w.bk), hp.head_dim, hp.n_head_kv, n);
    r.v = ggml_reshape_3d(g.ctx, add_bias(g.ctx, v, w.bv), hp.head_dim, hp.n_head_kv, n);
    if (w.q_norm) r.q = name(rms_norm(g.ctx, r.q, w.q_norm, norm_eps), "Qcur_normed", il);
    if (w.k_norm) r.k = name(rms_norm(g.ctx, r.k, w.k_norm, norm_eps), "Kcur_normed", il);
    return r;
}

ggml_tensor * rope(const GraphContext & g, ggml_tensor * x, ggml_tensor * freq_factors, int il) {
    const HParams & hp = g.hp;
    // a sliding layer: its own base, no scaling (llama.cpp's rope_freq_scale_train_swa = 1)
    const float scale = hp.window(il) > 0 ? 1.0f : hp.rope_freq_scale;
    // ext_factor 0: no YaRN; attn_factor 1; beta_fast 32, beta_slow 1 (llama.cpp's defaults)
    return ggml_rope_ext(g.ctx, x, g.in.pos, freq_factors, hp.n_rot, hp.rope_mode, hp.n_ctx_train, hp.rope_theta_of(il),
                         scale, 0.0f, 1.0f, 32.0f, 1.0f);
}

Qkv attention_input(const GraphContext & g, ggml_tensor * x, ggml_tensor * attn_norm, const QkvWeights & w, float eps,
                    ggml_tensor * freq_factors, int il) {
    Qkv a = qkv(g, w, name(rms_norm(g.ctx, x, attn_norm, eps), "attn_norm", il), eps, il);
    a.q = name(rope(g, a.q, freq_factors, il), "Qcur", il);
    a.k = name(rope(g, a.k, freq_factors, il), "Kcur", il);
    name(a.v, "Vcur", il);
    return a;
}

ggml_tensor * attention(const GraphContext & g, int il, const Qkv & qkv, ggml_tensor * wo, ggml_tensor * bo) {
    // F32 [n_head*head_dim, n_tokens]
    ggml_tensor * a = name(g.attention(il, qkv.q, qkv.k, qkv.v, qkv.x), "kqv_out", il);
    return name(linear(g, wo, bo, a), "attn_out", il);
}

FfnWeights load_ffn(const ModelReader & r, const HParams & hp, int il, int64_t n_ff) {
    using Role = ModelReader::Role;
    FfnWeights w;
    w.gate = r.required_layer(il, "ffn_gate.weight", {hp.n_embd, n_ff}, Role::matrix);
    w.up = r.required_layer(il, "ffn_up.weight", {hp.n_embd, n_ff}, Role::matrix);
    w.down = r.required_layer(il, "ffn_down.weight", {n_ff, hp.n_embd}, Role::matrix);
    return w;
}

ggml_tensor * ffn_silu_gated(const GraphContext & g, const FfnWeights & w, ggml_tensor * x, int il) {
    const auto [gate, up] = matmuls<2>(g, {w.gate, w.up}, x);
    name(gate, "ffn_gate", il);
    name(up, "ffn_up", il);
    // silu(gate) * up in one node, as libllama
    return matmul(g, w.down, name(ggml_swiglu_split(g.ctx, gate, up), "ffn_swiglu", il));
}

ggml_tensor * ffn_gelu_gated(const GraphContext & g, const FfnWeights & w, ggml_tensor * x, int il) {
    const auto [gate, up] = matmuls<2>(g, {w.gate, w.up}, x);
    name(gate, "ffn_gate", il);
    name(up, "ffn_up", il);
    return matmul(g, w.down, name(ggml_geglu_split(g.ctx, gate, up), "ffn_geglu", il));
}

ggml_tensor * output_rows(const GraphContext & g, ggml_tensor * x) {
    return g.in.out_ids ? ggml_get_rows(g.ctx, x, g.in.out_ids) : x;
}

ggml_tensor * lm_head(const GraphContext & g, ggml_tensor * x, ggml_tensor * norm, float eps, ggml_tensor * w_out,
                      float softcap) {
    ggml_tensor * logits = matmul(g, w_out, name(rms_norm(g.ctx, x, norm, eps), "result_norm", -1));
    if (softcap > 0.0f)
        logits = ggml_scale(g.ctx, ggml_tanh(g.ctx, ggml_scale(g.ctx, logits, 1.0f / softcap)), softcap);
    name(logits, "result_output", -1);
    ggml_build_forward_expand(g.gf, logits);
    return logits;
}

}  // namespace kvlab::graph
