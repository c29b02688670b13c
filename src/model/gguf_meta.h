// GGUF opening with precise errors, and a deterministic summary of a GGUF file's metadata
// (tensor types, tokenizer / chat-template / metadata hashes) for provenance records.
// Uses only the gguf C API (gguf.h).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "ggml-cpp.h"
#include "gguf.h"

namespace kvlab {

struct GgufSummary {
    std::string arch;  // general.architecture, empty if absent
    int64_t n_tensors = 0;
    std::map<std::string, int64_t> tensor_type_counts;  // ggml type name -> number of tensors
    std::map<std::string, uint64_t> tensor_type_bytes;  // ggml type name -> bytes of tensor data
    std::string tokenizer_sha256;                       // over every "tokenizer." KV except tokenizer.chat_template
    std::string chat_template_sha256;                   // of tokenizer.chat_template's string; empty if none
    std::string metadata_sha256;                        // over all KVs
    int64_t n_kv = 0;
    uint32_t gguf_version = 0;
};

// Opens a GGUF file. Throws Error("gguf", ...) for: a missing file, a directory, a file without the
// GGUF magic, a file too short for its header or for its tensor data, and any other parse failure.
// With out_ctx non-null, a ggml_context holding the tensors is created (with data unless no_alloc).
gguf_context_ptr open_gguf_checked(const std::string & path, bool no_alloc, ggml_context_ptr * out_ctx);

// The string value of key; "" when absent or not a string.
std::string gguf_string(const gguf_context * ctx, const std::string & key);

GgufSummary summarize_gguf(const gguf_context * ctx);
nlohmann::json to_json(const GgufSummary & s);

}  // namespace kvlab
