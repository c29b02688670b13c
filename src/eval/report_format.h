// How the report writes numbers and text (report.cpp, report_stats.cpp, svg_plot.cpp,
// report_html.cpp): number and byte formats, XML escaping, and the summary table's columns, one
// cell per SummaryRow field, shared by the markdown table and the HTML page.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "eval/report.h"

namespace kvlab::eval::report {

// v through printf's format f; "-" when v is not finite.
std::string fmt(const char * f, double v);
// Bytes in B, KiB, MiB or GiB; "-" when not finite.
std::string fmt_bytes(double b);
std::string xml_escape(const std::string & s);

struct Column {
    const char * name;
    bool numeric;
    std::function<std::string(const SummaryRow &)> cell;
};
const std::vector<Column> & columns();

}  // namespace kvlab::eval::report
