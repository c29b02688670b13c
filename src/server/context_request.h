// The body of POST /v1/contexts: the context (text, or messages whose last user message is
// the context), an optional method with its ratio or budget, params and preset; checked field
// by field (ApiError 400 naming the field).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/press.h"
#include "kvlab/text.h"

namespace kvlab::server {

constexpr size_t k_max_name_bytes = 256;  // a context's optional name

struct ContextRequest {
    std::string text, name, method = "none", preset;
    std::vector<ChatMessage> before;
    ParamMap params;
    bool has_budget = false;
    Budget budget;
};

ContextRequest parse_context_request(const nlohmann::json & body);

}  // namespace kvlab::server
