// Fuzz target `http_body`: a request body of `kvlab serve`, for the endpoint chosen by the
// input's first byte (0 chat completions, 1 completions, 2 contexts): the JSON body, the
// request's fields (context ids, names, methods, tools: the limits of docs/server.md), and for a
// context the method made with its params and preset against the tiny model, as the routes do
// before any work. A refusal is an ApiError (a 4xx). First byte 3: the rest is a request path,
// matched against the registered endpoints (metrics, 405 with Allow) as the server does before
// reading any body.
#include <string>
#include <utility>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "server/api_error.h"
#include "server/context_request.h"
#include "server/openai.h"
#include "server/routes.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

void one(const uint8_t * data, size_t size) {
    if (size == 0) return;
    const std::string body(reinterpret_cast<const char *>(data) + 1, size - 1);
    try {
        if (data[0] % 4 == 3) {
            (void)server::endpoint_of(body);
            (void)server::allowed_methods(body);
            return;
        }
        const nlohmann::json j = server::parse_json_body(body);
        switch (data[0] % 4) {
            case 0:
            case 1:
                (void)server::parse_completion_request(j, data[0] % 3 == 0);
                break;
            default: {
                const server::ContextRequest r = server::parse_context_request(j, CacheTypes{});
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
        // what the server refuses (issue 32): an empty context, a malformed id, a method it lacks,
        // a name past its limit, tools and a response format it cannot honour
        {"chat-empty-context",
         std::string("\0", 1) + R"({"messages": [{"role": "user", "content": "x"}], "context": ""})"},
        {"chat-bad-id",
         std::string("\0", 1) + R"({"messages": [{"role": "user", "content": "x"}], "context": "a\u0000b/../c"})"},
        {"chat-tools", std::string("\0", 1) +
                           R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}],
                               "response_format": {"type": "json_object"}})"},
        {"context-unknown-method", std::string("\2") + R"({"text": "x", "method": "zip"})"},
        {"context-long-name", std::string("\2") + R"({"text": "x", "name": ")" + std::string(300, 'n') + "\"}"},
        {"path-context", std::string("\3") + "/v1/contexts/ctx-0123456789abcdef"},
        {"path-other", std::string("\3") + "/v1/contexts//x/"},
    };
    for (const auto & [name, body] : bodies) write_seed(dir, std::string(name) + ".bin", body);
}

const FuzzRegistrar reg({"http_body", [] { (void)tiny_model(); }, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
