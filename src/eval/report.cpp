// Reports from result records (report.h): the markdown table, the report's SVG figures drawn with
// svg_plot.h, and the reading of the records. The summary and its statistics are in
// report_stats.cpp, the HTML page in report_html.cpp, the number formats and table columns in
// report_format.cpp.
#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

#include "eval/report_format.h"
#include "eval/svg_plot.h"
#include "kvlab/error.h"

namespace kvlab::eval {
namespace {

using nlohmann::json;
using report::Column;
using report::columns;
using svg::kFullColor;
using svg::method_color;
using svg::nice_axis;
using svg::Plot;
using svg::Point;
using svg::Series;
using svg::time_axis;

// Rows grouped by method, in row order (summarize's order), each with its palette colour.
std::vector<std::pair<std::string, std::vector<const SummaryRow *>>> by_method(const std::vector<SummaryRow> & rows) {
    std::vector<std::pair<std::string, std::vector<const SummaryRow *>>> out;
    for (const SummaryRow & r : rows) {
        auto it = std::find_if(out.begin(), out.end(), [&](const auto & g) { return g.first == r.method; });
        if (it == out.end()) {
            out.emplace_back(r.method, std::vector<const SummaryRow *>{});
            it = out.end() - 1;
        }
        it->second.push_back(&r);
    }
    return out;
}

// One polyline per compressing method against the achieved ratio; the full cache as a line.
std::string line_plot(const std::vector<SummaryRow> & rows, const std::string & title, const std::string & ylabel,
                      double SummaryRow::*value, bool unit_range) {
    double xmax = 0.0, ymin = unit_range ? 0.0 : INFINITY, ymax = unit_range ? 1.0 : -INFINITY;
    for (const SummaryRow & r : rows) {
        if (std::isfinite(r.ratio)) xmax = std::max(xmax, r.ratio);
        if (std::isfinite(r.*value)) ymin = std::min(ymin, r.*value), ymax = std::max(ymax, r.*value);
    }
    Plot plot(title, "achieved compression ratio (1 - kept / context rows)", ylabel, nice_axis(0.0, xmax, true),
              nice_axis(ymin, ymax, true));
    size_t color = 0;
    for (const auto & [method, group] : by_method(rows)) {
        if (method.rfind("none", 0) == 0) {  // the full cache (of any run): a reference line
            if (method == "none") plot.reference("none (full cache)", group.front()->*value);
            continue;
        }
        Series s{method, method_color(color++), {}};
        for (const SummaryRow * r : group)
            if (std::isfinite(r->ratio) && std::isfinite(r->*value))
                s.points.push_back({r->ratio, r->*value, r->budget});
        std::stable_sort(s.points.begin(), s.points.end(), [](const Point & a, const Point & b) { return a.x < b.x; });
        plot.line_series(s);
    }
    if (rows.empty()) plot.note("no results");
    return plot.finish();
}

}  // namespace

std::string markdown_table(const std::vector<SummaryRow> & rows) {
    const auto cell = [](std::string s) {
        std::string out;
        for (char c : s) {
            if (c == '|') out += '\\';
            out += c == '\n' ? ' ' : c;
        }
        return out;
    };
    std::string head = "|", rule = "|";
    for (const Column & c : columns()) {
        head += " " + std::string(c.name) + " |";
        rule += c.numeric ? " ---: |" : " --- |";
    }
    std::string out = head + "\n" + rule + "\n";
    for (const SummaryRow & r : rows) {
        out += "|";
        for (const Column & c : columns()) out += " " + cell(c.cell(r)) + " |";
        out += "\n";
    }
    return out;
}

std::string svg_score_vs_ratio(const std::vector<SummaryRow> & rows) {
    return line_plot(rows, "Score vs compression ratio", "mean score", &SummaryRow::score, true);
}

std::string svg_kl_vs_ratio(const std::vector<SummaryRow> & rows) {
    return line_plot(rows, "KL(full || compressed) vs compression ratio", "mean KL (nats)", &SummaryRow::kl, false);
}

namespace {

// One polyline per (method, precision policy) against the bytes held; the full caches as squares.
std::string bytes_plot(const std::vector<SummaryRow> & rows, const std::string & title, const std::string & ylabel,
                       double SummaryRow::*value, bool unit_range) {
    double xmax = 0.0, ymin = unit_range ? 0.0 : INFINITY, ymax = unit_range ? 1.0 : -INFINITY;
    std::vector<std::pair<std::string, std::vector<const SummaryRow *>>> curves;
    Series full{"full caches", kFullColor, {}};
    for (const SummaryRow & r : rows) {
        if (!std::isfinite(r.bytes_ratio) || !std::isfinite(r.*value)) continue;
        xmax = std::max(xmax, r.bytes_ratio);
        ymin = std::min(ymin, r.*value), ymax = std::max(ymax, r.*value);
        if (r.method.rfind("none", 0) == 0) {
            full.points.push_back({r.bytes_ratio, r.*value, r.policy.empty() ? r.budget : r.policy});
            continue;
        }
        const std::string key = r.method + (r.policy.empty() ? "" : " \u00b7 " + r.policy);
        auto it = std::find_if(curves.begin(), curves.end(), [&](const auto & c) { return c.first == key; });
        if (it == curves.end()) it = curves.insert(curves.end(), {key, {}});
        it->second.push_back(&r);
    }
    Plot plot(title, "K/V bytes held (share of the full cache at F16)", ylabel, nice_axis(0.0, xmax, true),
              nice_axis(ymin, ymax, true));
    size_t color = 0;
    for (const auto & [key, group] : curves) {
        Series s{key, method_color(color++), {}};
        for (const SummaryRow * r : group) s.points.push_back({r->bytes_ratio, r->*value, r->budget});
        std::stable_sort(s.points.begin(), s.points.end(), [](const Point & a, const Point & b) { return a.x < b.x; });
        plot.line_series(s);
    }
    if (!full.points.empty()) plot.scatter(full, true);
    if (curves.empty() && full.points.empty()) plot.note("no records with K/V bytes");
    return plot.finish();
}

}  // namespace

std::string svg_score_vs_bytes(const std::vector<SummaryRow> & rows) {
    return bytes_plot(rows, "Score vs K/V bytes", "mean score", &SummaryRow::score, true);
}

std::string svg_kl_vs_bytes(const std::vector<SummaryRow> & rows) {
    return bytes_plot(rows, "KL(full || compressed) vs K/V bytes", "mean KL (nats)", &SummaryRow::kl, false);
}

std::string svg_memory_vs_ttft(const std::vector<SummaryRow> & rows) {
    double xmin = INFINITY, xmax = -INFINITY, bmax = 0.0;
    for (const SummaryRow & r : rows) {
        if (std::isfinite(r.ttft_s)) xmin = std::min(xmin, r.ttft_s), xmax = std::max(xmax, r.ttft_s);
        if (std::isfinite(r.kv_bytes)) bmax = std::max(bmax, r.kv_bytes);
    }
    double unit = 1.0;
    std::string unit_name = "B";
    if (bmax >= 1024.0 * 1024.0 * 1024.0)
        unit = 1024.0 * 1024.0 * 1024.0, unit_name = "GiB";
    else if (bmax >= 1024.0 * 1024.0)
        unit = 1024.0 * 1024.0, unit_name = "MiB";
    else if (bmax >= 1024.0)
        unit = 1024.0, unit_name = "KiB";
    Plot plot("KV memory vs time to first token", "TTFT (s)", "KV allocated (" + unit_name + ")", time_axis(xmin, xmax),
              nice_axis(0.0, bmax / unit, true));
    size_t color = 0;
    for (const auto & [method, group] : by_method(rows)) {
        if (method.rfind("none ", 0) == 0) continue;  // another run's full cache: drawn once
        const bool full = method == "none";
        Series s{full ? "none (full cache)" : method, full ? kFullColor : method_color(color++), {}};
        for (const SummaryRow * r : group) s.points.push_back({r->ttft_s, r->kv_bytes / unit, r->budget});
        plot.scatter(s, full);
    }
    if (rows.empty()) plot.note("no results");
    return plot.finish();
}

std::vector<json> read_records(const std::vector<std::string> & files) {
    std::vector<json> out;
    for (const std::string & file : files) {
        std::ifstream in(file);
        std::error_code ec;
        if (!in || std::filesystem::is_directory(file, ec))
            throw Error("eval", "cannot read results file '" + file + "'");
        std::string line;
        int64_t line_no = 0;
        while (std::getline(in, line)) {
            ++line_no;
            if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
            json j;
            try {
                j = json::parse(line);
            } catch (const json::exception & e) {  // parse_error, and out_of_range for a number too big
                throw Error("eval", file + ":" + std::to_string(line_no) + ": not JSON (" + e.what() + ")");
            }
            if (!j.is_object())
                throw Error("eval", file + ":" + std::to_string(line_no) + ": not a JSON object record");
            out.push_back(std::move(j));
        }
        if (in.bad()) throw Error("eval", "error reading results file '" + file + "'");
    }
    return out;
}

}  // namespace kvlab::eval
