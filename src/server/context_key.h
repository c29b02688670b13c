// A stored context's id as the address of its content: the same model file (its template
// included), messages before the text, text, method, preset, parameters, budget and K/V row types
// give the same id on every replica, so a context that exists is reused instead of made again.
// The context's `name` is a label, not content: it does not change the id.
#pragma once

#include <string>

#include "kvlab/compress_flow.h"

namespace kvlab::server {

// "ctx-" and 24 hex digits of the SHA-256 of the content's canonical JSON. `types`: the K/V row
// types the context is made with (the job's, or the server's default).
std::string context_key(const std::string & model_sha256, const ContextJob & job, const CacheTypes & types);

}  // namespace kvlab::server
