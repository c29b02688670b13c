#include "server/openai.h"

#include <random>

namespace kvlab::server {

namespace {

ApiError bad(const std::string & field, const std::string & what) {
    return ApiError(400, "'" + field + "' " + what, field);
}

double number(const nlohmann::json & b, const char * key, double def, double lo, double hi) {
    if (!b.contains(key) || b[key].is_null()) return def;
    if (!b[key].is_number()) throw bad(key, "must be a number");
    const double v = b[key].get<double>();
    if (!(v >= lo && v <= hi)) throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
}

int64_t integer(const nlohmann::json & b, const char * key, int64_t def, int64_t lo, int64_t hi) {
    if (!b.contains(key) || b[key].is_null()) return def;
    if (!b[key].is_number_integer()) throw bad(key, "must be an integer");
    const int64_t v = b[key].get<int64_t>();
    if (v < lo || v > hi) throw bad(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
}

bool boolean(const nlohmann::json & b, const char * key, bool def) {
    if (!b.contains(key) || b[key].is_null()) return def;
    if (!b[key].is_boolean()) throw bad(key, "must be true or false");
    return b[key].get<bool>();
}

}  // namespace

nlohmann::json parse_json_body(const std::string & body) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw ApiError(400, "the request body is not valid JSON");
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
}

std::vector<ChatMessage> parse_messages(const nlohmann::json & v, const std::string & field) {
    if (!v.is_array() || v.empty()) throw bad(field, "must be a non-empty array of messages");
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < v.size(); ++i) {
        const std::string at = field + "[" + std::to_string(i) + "]";
        const nlohmann::json & m = v[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw bad(at, "needs a string 'role'");
        const std::string role = m["role"];
        if (role != "system" && role != "user" && role != "assistant" && role != "developer")
            throw bad(at + ".role", "must be system, developer, user or assistant");
        std::string content;
        if (m.contains("content") && m["content"].is_string()) {
            content = m["content"];
        } else if (m.contains("content") && m["content"].is_array()) {  // text parts
            for (const auto & part : m["content"]) {
                if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
                    !part["text"].is_string())
                    throw bad(at + ".content", "parts must be {\"type\": \"text\", \"text\": ...}");
                content += part["text"].get<std::string>();
            }
        } else {
            throw bad(at + ".content", "must be a string or an array of text parts");
        }
        out.push_back({role == "developer" ? "system" : role, content});
    }
    return out;
}

CompletionRequest parse_completion_request(const nlohmann::json & b, bool chat) {
    CompletionRequest r;
    r.chat = chat;
    if (chat) {
        if (!b.contains("messages")) throw bad("messages", "is required");
        r.messages = parse_messages(b["messages"], "messages");
    } else {
        if (!b.contains("prompt")) throw bad("prompt", "is required");
        if (b["prompt"].is_string())
            r.prompt = b["prompt"];
        else if (b["prompt"].is_array() && b["prompt"].size() == 1 && b["prompt"][0].is_string())
            r.prompt = b["prompt"][0];
        else
            throw bad("prompt", "must be a string");
    }
    if (b.contains("context")) {  // an empty selection must not answer without the user's document
        if (!b["context"].is_string() || b["context"].get<std::string>().empty())
            throw bad("context", "must be a stored context's id (omit the field to answer without one)");
        r.context = b["context"];
    }
    if (b.contains("model") && !b["model"].is_null() && !b["model"].is_string()) throw bad("model", "must be a string");
    if (b.contains("model") && b["model"].is_string()) r.model = b["model"];
    // what kvlab cannot do is refused, never silently dropped
    for (const char * key : {"tools", "functions"})
        if (b.contains(key) && !b[key].is_null() && !(b[key].is_array() && b[key].empty()))
            throw bad(key, "is not supported: kvlab runs no tools");
    if (b.contains("response_format") && !b["response_format"].is_null() &&
        !(b["response_format"].is_object() && b["response_format"].value("type", "") == "text"))
        throw bad("response_format", "is not supported beyond {\"type\": \"text\"}: kvlab constrains no output");
    if (integer(b, "n", 1, 1, 1) != 1) throw bad("n", "must be 1");
    const char * max_key = b.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    r.max_tokens = int32_t(integer(b, max_key, chat ? 256 : 16, 1, 1 << 20));
    r.sampling.temp = float(number(b, "temperature", 1.0, 0.0, 2.0));
    r.sampling.top_p = float(number(b, "top_p", 1.0, 0.0, 1.0));
    if (r.sampling.top_p <= 0.0f) throw bad("top_p", "must be above 0");
    r.sampling.top_k = int32_t(integer(b, "top_k", 0, 0, 1 << 20));  // llama.cpp's extension
    r.sampling.seed = b.contains("seed") && !b["seed"].is_null() ? uint64_t(integer(b, "seed", 0, INT64_MIN, INT64_MAX))
                                                                 : std::random_device{}();
    if (b.contains("stop") && !b["stop"].is_null()) {
        const auto & s = b["stop"];
        if (s.is_string()) {
            r.stop.push_back(s);
        } else if (s.is_array() && s.size() <= 4) {
            for (const auto & x : s) {
                if (!x.is_string()) throw bad("stop", "must be a string or an array of up to 4 strings");
                r.stop.push_back(x);
            }
        } else {
            throw bad("stop", "must be a string or an array of up to 4 strings");
        }
    }
    r.stream = boolean(b, "stream", false);
    r.ignore_eos = boolean(b, "ignore_eos", false);
    if (b.contains("stream_options") && b["stream_options"].is_object())
        r.include_usage = boolean(b["stream_options"], "include_usage", false);
    if (chat) {
        r.logprobs = boolean(b, "logprobs", false);
        r.top_logprobs = int32_t(integer(b, "top_logprobs", 0, 0, 20));
        if (r.top_logprobs > 0 && !r.logprobs) throw bad("top_logprobs", "needs 'logprobs': true");
    } else if (b.contains("logprobs") && !b["logprobs"].is_null()) {  // completions: an integer 0..5
        r.top_logprobs = int32_t(integer(b, "logprobs", 0, 0, 5));
        r.logprobs = true;
    }
    return r;
}

}  // namespace kvlab::server
