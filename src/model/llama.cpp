// Architecture `llama`: SmolLM2, TinyLlama, Llama 2/3.x. RoPE in normal (GPT-J) mode,
// optional Llama-3 frequency factors (rope_freqs.weight), no attention biases.
#include "ggml.h"
#include "model/arch.h"

namespace kvlab {
namespace {

class LlamaArch final : public Architecture {
public:
    std::string name() const override { return "llama"; }
    void load_hparams(const gguf_context *, HParams & hp) const override { hp.rope_mode = GGML_ROPE_TYPE_NORMAL; }
};

ArchRegistrar<LlamaArch> registrar;

}  // namespace
}  // namespace kvlab
