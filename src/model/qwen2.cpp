// Architecture `qwen2`: Qwen2 / Qwen2.5. NeoX RoPE, biases on Q, K and V.
#include "ggml.h"
#include "model/arch.h"

namespace kvlab {
namespace {

class Qwen2Arch final : public Architecture {
public:
    std::string name() const override { return "qwen2"; }
    void load_hparams(const gguf_context *, HParams & hp) const override { hp.rope_mode = GGML_ROPE_TYPE_NEOX; }
    void load_layer(const TensorLookup & t, int il, LayerWeights & lw) const override {
        Architecture::load_layer(t, il, lw);
        lw.bq = t.required_layer(il, "attn_q.bias");
        lw.bk = t.required_layer(il, "attn_k.bias");
        lw.bv = t.required_layer(il, "attn_v.bias");
    }
};

ArchRegistrar<Qwen2Arch> registrar;

}  // namespace
}  // namespace kvlab
