// Architecture `qwen3`: Qwen3 dense. The llama family with NeoX RoPE and RMS norms on
// each head of Q and K (before RoPE); head_dim is independent of n_embd / n_head.
#include "model/llama_family.h"

namespace kvlab {
namespace {

const ArchRegistrar registrar("qwen3",
                              [] { return make_llama_family({.rope_mode = GGML_ROPE_TYPE_NEOX, .qk_norm = true}); });

}  // namespace
}  // namespace kvlab
