// The OpenAI-compatible request shapes kvlab serves: /v1/chat/completions and
// /v1/completions bodies, checked field by field (a wrong type or range is a 400 naming
// the field), plus kvlab's own field `context` (a stored context's id).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/engine.h"
#include "kvlab/text.h"
#include "server/api_error.h"

namespace kvlab::server {

struct CompletionRequest {
    bool chat = true;
    std::vector<ChatMessage> messages;  // chat
    std::string prompt;                 // completions
    std::string context;                // a stored context's id ("" for none)
    int32_t max_tokens = 256;
    SamplingParams sampling;  // temperature default 1 (OpenAI's), top_p 1, seed random
    std::vector<std::string> stop;
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    bool ignore_eos = false;     // llama.cpp's and vLLM's extension: answers of max_tokens (benchmarks)
    bool logprobs = false;
    int32_t top_logprobs = 0;
    std::string model;  // as the client named it ("" when absent); the server runs one model
};

// Throws ApiError(400) naming the field.
CompletionRequest parse_completion_request(const nlohmann::json & body, bool chat);

// A JSON body: throws ApiError(400) for anything that is not a JSON object.
nlohmann::json parse_json_body(const std::string & body);

// Messages of a request ({role, content}, content a string or text parts).
std::vector<ChatMessage> parse_messages(const nlohmann::json & v, const std::string & field);

}  // namespace kvlab::server
