// Fuzz target `http_body`: a request body of `kvlab serve`, for the endpoint chosen by the
// input's first byte (0 chat completions, 1 completions, 2 contexts): the JSON body, the
// request's fields, and for a context the method made with its params and preset against
// the tiny model, as the routes do before any work. A refusal is an ApiError (a 4xx).
#include <string>
#include <utility>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "server/api_error.h"
#include "server/context_request.h"
#include "server/openai.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

void one(const uint8_t * data, size_t size) {
    if (size == 0) return;
    const std::string body(reinterpret_cast<const char *>(data) + 1, size - 1);
    try {
        const nlohmann::json j = server::parse_json_body(body);
        switch (data[0] % 3) {
            case 0:
            case 1:
                (void)server::parse_completion_request(j, data[0] % 3 == 0);
                break;
            default: {
                const server::ContextRequest r = server::parse_context_request(j);
                if (r.method != "none")
                    (void)make_press(r.method, apply_preset(r.preset, r.method, r.params), tiny_model());
                if (r.has_budget) (void)r.budget.per_layer(1000);
            }
        }
    } catch (const server::ApiError & e) {
        if (e.status < 400 || e.status >= 500) throw;
    } catch (const Error &) {
    }
}

// Bodies as the OpenAI clients and the tests/server suite send them (first byte: endpoint).
void seeds(const std::string & dir) {
    const std::pair<const char *, std::string> bodies[] = {
        {"chat",
         std::string("\0", 1) +
             R"({"model": "smollm2-135m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "What is the code?"}]}], "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n", "."], "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "context": "ctx-0123456789abcdef"})"},
        {"completion",
         std::string("\1") +
             R"({"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stop": "END"})"},
        {"context-text",
         std::string("\2") +
             R"({"text": "The code is 7431.", "system": "You answer questions about the document.", "name": "doc", "method": "snapkv", "ratio": 0.5, "params": {"window": 8, "kernel": 3}})"},
        {"context-messages",
         std::string("\2") +
             R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The door is blue."}], "method": "kvzip", "budget": 16, "preset": "kvpress"})"},
        {"context-full", std::string("\2") + R"({"text": "A context kept whole.", "name": null})"},
    };
    for (const auto & [name, body] : bodies) write_seed(dir, std::string(name) + ".bin", body);
}

const FuzzRegistrar reg({"http_body", [] { (void)tiny_model(); }, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
