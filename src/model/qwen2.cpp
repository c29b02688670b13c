// Architecture `qwen2`: Qwen2 / Qwen2.5. The llama family with NeoX RoPE and biases on
// Q, K and V.
#include "model/llama_family.h"

namespace kvlab {
namespace {

const ArchRegistrar registrar("qwen2",
                              [] { return make_llama_family({.rope_mode = GGML_ROPE_TYPE_NEOX, .qkv_bias = true}); });

}  // namespace
}  // namespace kvlab
