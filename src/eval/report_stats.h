// Reading the fields of result records, for the summary (summarize, best_per_ratio and
// best_per_bytes of report.h, in report_stats.cpp) and the HTML page. Records are read
// defensively: a missing or non-numeric field is left out of its mean (a mean of nothing is 0),
// so every number written is finite.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvlab::eval::report {

// j's field `key`; nullptr when j is not an object or the field is absent or null.
const nlohmann::json * field(const nlohmann::json & j, const char * key);
// A number (or a bool as 0/1); NaN when absent or of another type.
double number(const nlohmann::json & j, const char * key);
// A string field; fallback when absent or of another type.
std::string text(const nlohmann::json & j, const char * key, const std::string & fallback);

}  // namespace kvlab::eval::report
