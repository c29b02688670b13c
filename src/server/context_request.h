// The body of POST /v1/contexts: the context (text, or messages whose last user message is
// the context), an optional method with its ratio or budget, params and preset, the K/V row
// types (cache_type_k / cache_type_v: f16, q8_0, q4_0, each defaulting to the server's); checked field
// by field (ApiError 400 naming the field).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "kvlab/press.h"
#include "kvlab/text.h"

namespace kvlab::server {

constexpr size_t k_max_name_bytes = 256;  // a context's optional name

struct ContextRequest {
    std::string text, name, method = "none", preset;
    std::vector<ChatMessage> before;
    ParamMap params;
    bool has_budget = false;
    bool demotes = false;  // demote (and high_share) were given
    Budget budget;
    std::optional<CacheTypes> cache_types;  // cache_type_k / cache_type_v; unset: the server's
};

// default_types: the server's (-ctk / -ctv), for the one of the two a request leaves out.
ContextRequest parse_context_request(const nlohmann::json & body, CacheTypes default_types);

}  // namespace kvlab::server
