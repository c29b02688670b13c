// An error a request gets back: an HTTP status and an OpenAI-style body
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace kvlab::server {

struct ApiError : std::runtime_error {
    int status;
    std::string type, param, code;
    ApiError(int status, const std::string & message, std::string param = "", std::string code = "")
        : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {
        type = status == 401   ? "authentication_error"
               : status == 404 ? "not_found_error"
               : status == 429 ? "rate_limit_error"
               : status >= 500 ? "server_error"
                               : "invalid_request_error";
    }
    nlohmann::json body() const {
        return {{"error",
                 {{"message", what()},
                  {"type", type},
                  {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
                  {"code", code.empty() ? nlohmann::json() : nlohmann::json(code)}}}};
    }
};

}  // namespace kvlab::server
