#include "server/metrics.h"

#include <cstdio>
#include <tuple>

namespace kvlab::server {

namespace {
std::string num(double v) {
    char b[64];
    std::snprintf(b, sizeof(b), "%.9g", v);
    return b;
}
}  // namespace

void Histogram::observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
}

std::string Histogram::render(const std::string & name, const std::string & help) const {
    std::string s = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
        cum += counts_[i];
        s += name + "_bucket{le=\"" + (i < bounds_.size() ? num(bounds_[i]) : "+Inf") + "\"} " + std::to_string(cum) +
             "\n";
    }
    s += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
    return s;
}

void Metrics::request(const std::string & endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{endpoint, status}];
}

void Metrics::ttft(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_.observe(seconds);
}

void Metrics::decode_per_token(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    decode_.observe(seconds);
}

void Metrics::tokens(int64_t prompt, int64_t generated) {
    std::lock_guard<std::mutex> lock(mu_);
    prompt_tokens_ += uint64_t(prompt);
    generated_tokens_ += uint64_t(generated);
}

std::string Metrics::render(const std::vector<std::tuple<std::string, std::string, double>> & gauges) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s =
        "# HELP kvlab_requests_total HTTP requests by endpoint and status code.\n"
        "# TYPE kvlab_requests_total counter\n";
    uint64_t errors = 0;
    for (const auto & [key, n] : requests_) {
        s += "kvlab_requests_total{endpoint=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
        if (key.second >= 400) errors += n;
    }
    s += "# HELP kvlab_request_errors_total HTTP requests answered with a 4xx or 5xx status.\n"
         "# TYPE kvlab_request_errors_total counter\nkvlab_request_errors_total " +
         std::to_string(errors) + "\n";
    s += "# HELP kvlab_prompt_tokens_total Query tokens evaluated (stored contexts' tokens not counted).\n"
         "# TYPE kvlab_prompt_tokens_total counter\nkvlab_prompt_tokens_total " +
         std::to_string(prompt_tokens_) + "\n";
    s += "# HELP kvlab_generated_tokens_total Tokens generated.\n"
         "# TYPE kvlab_generated_tokens_total counter\nkvlab_generated_tokens_total " +
         std::to_string(generated_tokens_) + "\n";
    s += ttft_.render("kvlab_time_to_first_token_seconds",
                      "Request received to first token sampled (queue, context load and copy, query prefill).");
    s += decode_.render("kvlab_decode_seconds_per_token", "Decode time per generated token after the first.");
    for (const auto & [name, help, value] : gauges) {  // Prometheus' rule: a name ending in _total counts
        const char * type = name.ends_with("_total") ? " counter\n" : " gauge\n";
        s += "# HELP " + name + " " + help + "\n# TYPE " + name + type + name + " " + num(value) + "\n";
    }
    return s;
}

}  // namespace kvlab::server
