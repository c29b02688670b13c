#include "model/graph_builders.h"

#include "model/gemm_q4_1.h"
#include "model/gemm_q4_1_amx.h"
#include "model/gemm_q8_0.h"

namespace kvlab::graph {

ggml_tensor * matmul(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x) {
    if (gemm_amx::applies(w, x)) return gemm_amx::mul_mat(ctx, w, x);
    if (gemm::applies(w, x)) return gemm::mul_mat_q4_1(ctx, w, x);
    if (gemm_q8_0::applies(w, x)) return gemm_q8_0::mul_mat(ctx, w, x);
    return ggml_mul_mat(ctx, w, x);
}

ggml_tensor * embed(const GraphContext & g, ggml_tensor * tok_embd) {
    return ggml_get_rows(g.ctx, tok_embd, g.in.tokens);
}

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) {
    ggml_tensor * y = matmul(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

Qkv qkv(const GraphContext & g, const QkvWeights & w, ggml_tensor * x, float norm_eps) {
    const HParams & hp = g.hp;
    const int64_t n = g.n_tokens();
    Qkv r;
    r.q = ggml_reshape_3d(g.ctx, linear(g.ctx, w.wq, w.bq, x), hp.head_dim, hp.n_head, n);
    r.k = ggml_reshape_3d(g.ctx, linear(g.ctx, w.wk, w.bk, x), hp.head_dim, hp.n_head_kv, n);
    r.v = ggml_reshape_3d(g.ctx, linear(g.ctx, w.wv, w.bv, x), hp.head_dim, hp.n_head_kv, n);
    if (w.q_norm) r.q = rms_norm(g.ctx, r.q, w.q_norm, norm_eps);
    if (w.k_norm) r.k = rms_norm(g.ctx, r.k, w.k_norm, norm_eps);
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

ggml_tensor * attention(const GraphContext & g, int il, const Qkv & qkv, ggml_tensor * wo, ggml_tensor * bo) {
    ggml_tensor * a = g.attention(il, qkv.q, qkv.k, qkv.v);  // F32 [n_head*head_dim, n_tokens]
    return linear(g.ctx, wo, bo, a);
}

ggml_tensor * ffn_silu_gated(ggml_context * ctx, const FfnWeights & w, ggml_tensor * x) {
    ggml_tensor * gate = ggml_silu(ctx, matmul(ctx, w.gate, x));
    return matmul(ctx, w.down, ggml_mul(ctx, gate, matmul(ctx, w.up, x)));
}

ggml_tensor * ffn_gelu_gated(ggml_context * ctx, const FfnWeights & w, ggml_tensor * x) {
    return matmul(ctx, w.down, ggml_geglu_split(ctx, matmul(ctx, w.gate, x), matmul(ctx, w.up, x)));
}

ggml_tensor * output_rows(const GraphContext & g, ggml_tensor * x) {
    return g.in.out_ids ? ggml_get_rows(g.ctx, x, g.in.out_ids) : x;
}

ggml_tensor * lm_head(const GraphContext & g, ggml_tensor * x, ggml_tensor * norm, float eps, ggml_tensor * w_out,
                      float softcap) {
    ggml_tensor * logits = matmul(g.ctx, w_out, rms_norm(g.ctx, x, norm, eps));
    if (softcap > 0.0f)
        logits = ggml_scale(g.ctx, ggml_tanh(g.ctx, ggml_scale(g.ctx, logits, 1.0f / softcap)), softcap);
    ggml_build_forward_expand(g.gf, logits);
    return logits;
}

}  // namespace kvlab::graph
