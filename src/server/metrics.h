// The server's figures in Prometheus' text exposition format (version 0.0.4): counters of
// requests by endpoint and status, histograms of time to first token and of decode time
// per token, gauges set by the caller when scraped (resident KV bytes, contexts, queue).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace kvlab::server {

class Histogram {
public:
    explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
    void observe(double v);
    // `name`_bucket{le=...}, _sum, _count lines
    std::string render(const std::string & name, const std::string & help) const;

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
    double sum_ = 0.0;
    uint64_t count_ = 0;
};

class Metrics {
public:
    void request(const std::string & endpoint, int status);
    void ttft(double seconds);
    void decode_per_token(double seconds);
    void tokens(int64_t prompt, int64_t generated);
    // The whole exposition; the caller's figures as (name, help, value), read when scraped: a
    // counter when the name ends in _total (a count the caller only ever increments), else a gauge.
    std::string render(const std::vector<std::tuple<std::string, std::string, double>> & gauges) const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    Histogram ttft_{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
    Histogram decode_{{0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1}};
    uint64_t prompt_tokens_ = 0, generated_tokens_ = 0;
};

}  // namespace kvlab::server
