// Fuzz target `gguf`: a model file from a stranger, through everything kvlab does with one
// before answering: the checked open and metadata summary (`kvlab info`), the model load
// (hyper-parameters, tensor shapes and types, tensor data), libllama's vocabulary behind
// kvlab's checks, and a 3-token prefill on whatever loaded.
#include <cstring>

#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/text.h"
#include "model/gguf_meta.h"
#include "support/tiny_gguf.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

void one(const uint8_t * data, size_t size) {
    const std::string path = input_file(data, size, ".gguf");
    try {
        (void)summarize_gguf(open_gguf_checked(path, /*no_alloc=*/true, nullptr).get());
    } catch (const Error &) {
        return;
    }
    try {
        const Tokenizer tok(path);
        (void)tok.encode("Hello, world: 123 <|im_start|> \xc3\xa9", true, true);
    } catch (const Error &) {
    }
    try {
        const auto model = Model::load(path, {.n_threads = 1});
        Engine engine(*model);
        KvStore cache = engine.new_cache(8);
        const int32_t n = model->hparams().n_vocab;
        (void)engine.prefill(cache, {0, n / 2, n - 1});
    } catch (const Error &) {
    }
}

// Tiny models of every architecture and weight type kvlab loads, with the default model's
// first 256 tokens as their vocabulary: a few tens of KiB each.
void seeds(const std::string & dir) {
    struct Seed {
        const char * arch;
        ggml_type type;
    };
    for (const Seed s : {Seed{"llama", GGML_TYPE_F32}, Seed{"qwen2", GGML_TYPE_Q8_0}, Seed{"qwen3", GGML_TYPE_F16}}) {
        test::TinySpec spec;
        spec.arch = s.arch;
        spec.n_layer = 1;
        spec.n_embd = 32;
        spec.n_head = 2;
        spec.n_head_kv = 1;
        spec.head_dim = 16;
        spec.n_ff = 32;
        spec.n_ctx_train = 64;
        spec.weight_type = s.type;
        spec.vocab_size = 256;
        const std::string name = std::string(s.arch) + "-" + ggml_type_name(s.type) + ".gguf";
        test::write_tiny_gguf(spec, test::default_model_path(), dir + "/" + name);
    }
}

const FuzzRegistrar reg({"gguf", [] {}, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
