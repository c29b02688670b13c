// Architecture `qwen3`: Qwen3 dense. NeoX RoPE, RMS norms on Q and K per head
// (applied before RoPE), head_dim independent of n_embd / n_head.
#include "ggml.h"
#include "model/arch.h"

namespace kvlab {
namespace {

class Qwen3Arch final : public Architecture {
public:
    std::string name() const override { return "qwen3"; }
    void load_hparams(const gguf_context *, HParams & hp) const override { hp.rope_mode = GGML_ROPE_TYPE_NEOX; }
    void load_layer(const TensorLookup & t, int il, LayerWeights & lw) const override {
        Architecture::load_layer(t, il, lw);
        lw.q_norm = t.required_layer(il, "attn_q_norm.weight");
        lw.k_norm = t.required_layer(il, "attn_k_norm.weight");
    }
};

ArchRegistrar<Qwen3Arch> registrar;

}  // namespace
}  // namespace kvlab
