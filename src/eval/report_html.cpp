// The report's self-contained HTML page (html_report in report.h): the model and run, the
// summary table, the plots inline, the best at each byte budget, the configuration and provenance.
#include <cmath>
#include <filesystem>
#include <utility>
#include <vector>

#include "eval/report.h"
#include "eval/report_format.h"
#include "eval/report_stats.h"

namespace kvlab::eval {
namespace {

using nlohmann::json;
using report::Column;
using report::columns;
using report::field;
using report::fmt_bytes;
using report::xml_escape;

}  // namespace

std::string html_report(const std::vector<SummaryRow> & rows, const json & header) {
    const auto dump = [](const json & j) { return j.dump(2, ' ', false, json::error_handler_t::replace); };
    const auto value = [&](const json & j) { return j.is_string() ? j.get<std::string>() : dump(j); };
    const json * prov = field(header, "provenance");
    const json * model = prov ? field(*prov, "model") : nullptr;

    // the model's summary: model.path, model.sha256, and the architecture wherever it is
    std::vector<std::pair<std::string, std::string>> facts;
    std::string model_name;
    if (model) {
        if (const json * p = field(*model, "path")) {
            facts.push_back({"model", value(*p)});
            if (p->is_string()) model_name = std::filesystem::path(p->get<std::string>()).filename().string();
        }
        if (const json * s = field(*model, "sha256")) facts.push_back({"sha256", value(*s)});
        if (const json * b = field(*model, "file_bytes"); b && b->is_number())
            facts.push_back({"file size", fmt_bytes(b->get<double>())});
    }
    const json * arch = model ? field(*model, "arch") : nullptr;
    if (!arch && model && field(*model, "gguf")) arch = field(*field(*model, "gguf"), "arch");
    if (!arch && prov && field(*prov, "hparams")) arch = field(*field(*prov, "hparams"), "arch");
    if (arch) facts.push_back({"arch", value(*arch)});
    if (const json * b = prov ? field(*prov, "build") : nullptr) {
        if (const json * v = field(*b, "kvlab_git_commit")) facts.push_back({"kvlab commit", value(*v)});
    }
    if (const json * m = prov ? field(*prov, "machine") : nullptr) {
        if (const json * v = field(*m, "backend")) facts.push_back({"backend", value(*v)});
        if (const json * v = field(*m, "cpu")) facts.push_back({"cpu", value(*v)});
    }
    if (const json * v = field(header, "kvlab_version")) facts.push_back({"kvlab version", value(*v)});
    if (const json * v = field(header, "shard")) facts.push_back({"shard", value(*v)});

    const std::string title = "kvlab report" + (model_name.empty() ? "" : " \u2014 " + model_name);
    std::string h;
    h += "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
    h += "<title>" + xml_escape(title) + "</title>\n";
    h += "<style>\nbody{font-family:sans-serif;margin:2em;color:#222}\n"
         "table{border-collapse:collapse;margin:1em 0}\n"
         "th,td{border:1px solid #ccc;padding:3px 8px}\nth{background:#f0f0f0}\n"
         "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
         "pre{background:#f7f7f7;padding:1em;overflow:auto;max-height:30em}\n"
         "figure{display:inline-block;margin:0.5em}\n</style>\n</head>\n<body>\n";
    h += "<h1>" + xml_escape(title) + "</h1>\n";

    h += "<h2>Model and run</h2>\n";
    if (facts.empty())
        h += "<p>No provenance in the header record.</p>\n";
    else {
        h += "<table>\n";
        for (const auto & [k, v] : facts)
            h += "<tr><th>" + xml_escape(k) + "</th><td>" + xml_escape(v) + "</td></tr>\n";
        h += "</table>\n";
    }

    h += "<h2>Summary</h2>\n<table>\n<tr>";
    for (const Column & c : columns()) h += "<th>" + xml_escape(c.name) + "</th>";
    h += "</tr>\n";
    for (const SummaryRow & r : rows) {
        h += "<tr>";
        for (const Column & c : columns())
            h += std::string(c.numeric ? "<td class=\"num\">" : "<td>") + xml_escape(c.cell(r)) + "</td>";
        h += "</tr>\n";
    }
    h += "</table>\n";

    h += "<h2>Plots</h2>\n";
    for (const std::string & svg : {svg_score_vs_ratio(rows), svg_kl_vs_ratio(rows), svg_memory_vs_ttft(rows)})
        h += "<figure>\n" + svg + "</figure>\n";
    bool bytes = false;
    for (const SummaryRow & r : rows) bytes = bytes || std::isfinite(r.bytes_ratio);
    if (bytes)
        for (const std::string & svg : {svg_score_vs_bytes(rows), svg_kl_vs_bytes(rows)})
            h += "<figure>\n" + svg + "</figure>\n";
    const std::string best = best_per_bytes(rows);
    if (!best.empty()) h += "<h2>Best at each byte budget</h2>\n<pre>" + xml_escape(best) + "</pre>\n";

    h += "<h2>Configuration</h2>\n<pre>";
    const json * config = field(header, "config");
    h += xml_escape(config ? dump(*config) : "(none)") + "</pre>\n";
    if (prov)
        h += "<details>\n<summary>Full provenance</summary>\n<pre>" + xml_escape(dump(*prov)) + "</pre>\n</details>\n";
    h += "</body>\n</html>\n";
    return h;
}

}  // namespace kvlab::eval
