// The decoder graph shared by the llama-family architectures. What differs per
// architecture is data in LayerWeights (optional biases and Q/K norms) and HParams
// (RoPE mode), filled by the architecture's own file.
#include <cmath>

#include "ggml.h"
#include "model/arch.h"

namespace kvlab {

namespace {

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

ggml_tensor * rope(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos, ggml_tensor * freqs, const HParams & hp) {
    // ext_factor 0: no YaRN; attn_factor 1; beta_fast 32, beta_slow 1 (llama.cpp defaults).
    return ggml_rope_ext(ctx, x, pos, freqs, hp.n_rot, hp.rope_mode, hp.n_ctx_train, hp.rope_theta,
                         hp.rope_freq_scale, 0.0f, 1.0f, 32.0f, 1.0f);
}

}  // namespace

ggml_tensor * build_decoder(ggml_context * ctx, ggml_cgraph * gf, const Model & model, const GraphInputs & in,
                            const AttentionFn & attention) {
    const HParams & hp = model.hparams();
    const Weights & w = model.weights();
    const int64_t n_tokens = in.tokens->ne[0];

    ggml_tensor * x = ggml_get_rows(ctx, w.tok_embd, in.tokens);  // F32 [n_embd, n_tokens]
    for (int il = 0; il < hp.n_layer; ++il) {
        const LayerWeights & lw = w.layers[il];
        ggml_tensor * h = rms_norm(ctx, x, lw.attn_norm, hp.rms_eps);

        ggml_tensor * q = ggml_reshape_3d(ctx, linear(ctx, lw.wq, lw.bq, h), hp.head_dim, hp.n_head, n_tokens);
        ggml_tensor * k = ggml_reshape_3d(ctx, linear(ctx, lw.wk, lw.bk, h), hp.head_dim, hp.n_head_kv, n_tokens);
        ggml_tensor * v = ggml_reshape_3d(ctx, linear(ctx, lw.wv, lw.bv, h), hp.head_dim, hp.n_head_kv, n_tokens);
        if (lw.q_norm) q = rms_norm(ctx, q, lw.q_norm, hp.rms_eps);
        if (lw.k_norm) k = rms_norm(ctx, k, lw.k_norm, hp.rms_eps);
        q = rope(ctx, q, in.pos, w.rope_freqs, hp);
        k = rope(ctx, k, in.pos, w.rope_freqs, hp);

        ggml_tensor * a = attention(il, q, k, v);  // F32 [n_head*head_dim, n_tokens]
        a = ggml_mul_mat(ctx, lw.wo, a);
        if (il == hp.n_layer - 1 && in.out_ids) {
            // only the rows whose logits are wanted go through the last FFN and the head
            a = ggml_get_rows(ctx, a, in.out_ids);
            x = ggml_get_rows(ctx, x, in.out_ids);
        }
        x = ggml_add(ctx, x, a);

        h = rms_norm(ctx, x, lw.ffn_norm, hp.rms_eps);
        ggml_tensor * g = ggml_silu(ctx, ggml_mul_mat(ctx, lw.ffn_gate, h));
        ggml_tensor * f = ggml_mul_mat(ctx, lw.ffn_down, ggml_mul(ctx, g, ggml_mul_mat(ctx, lw.ffn_up, h)));
        x = ggml_add(ctx, x, f);
    }
    x = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    ggml_tensor * logits = ggml_mul_mat(ctx, w.output, x);  // F32 [n_vocab, n_out]
    ggml_build_forward_expand(gf, logits);
    return logits;
}

}  // namespace kvlab
