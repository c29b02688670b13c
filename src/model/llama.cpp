// Architecture `llama`: SmolLM2, TinyLlama, Llama 2/3.x. The llama family as it is: RoPE
// in normal (GPT-J) mode, optional Llama-3 frequency factors, optional attention biases.
#include "model/llama_family.h"

namespace kvlab {
namespace {

const ArchRegistrar registrar("llama", [] { return make_llama_family({.rope_mode = GGML_ROPE_TYPE_NORMAL}); });

}  // namespace
}  // namespace kvlab
