// How the report writes numbers and text: number and byte formats, XML escaping, the summary
// table's columns (report_format.h).
#include "eval/report_format.h"

#include <cmath>
#include <cstdio>

namespace kvlab::eval::report {

std::string fmt(const char * f, double v) {
    if (!std::isfinite(v)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

std::string fmt_bytes(double b) {
    if (!std::isfinite(b)) return "-";
    const double a = std::fabs(b);
    if (a >= 1024.0 * 1024.0 * 1024.0) return fmt("%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
    if (a >= 1024.0 * 1024.0) return fmt("%.1f MiB", b / (1024.0 * 1024.0));
    if (a >= 1024.0) return fmt("%.1f KiB", b / 1024.0);
    return fmt("%.0f B", b);
}

const std::vector<Column> & columns() {
    static const std::vector<Column> cols = {
        {"method", false, [](const SummaryRow & r) { return r.method; }},
        {"budget", false, [](const SummaryRow & r) { return r.budget; }},
        {"ratio", true, [](const SummaryRow & r) { return fmt("%.3f", r.ratio); }},
        {"n", true, [](const SummaryRow & r) { return std::to_string(r.n); }},
        {"score", true, [](const SummaryRow & r) { return fmt("%.3f", r.score); }},
        {"score q1", true, [](const SummaryRow & r) { return fmt("%.3f", r.score_first); }},
        {"score later q", true,
         [](const SummaryRow & r) {
             return std::isfinite(r.score_later) ? fmt("%.3f", r.score_later) : std::string("–");
         }},
        {"KL", true, [](const SummaryRow & r) { return fmt("%.4g", r.kl); }},
        {"top-1", true, [](const SummaryRow & r) { return fmt("%.3f", r.top1); }},
        {"identical", true, [](const SummaryRow & r) { return fmt("%.3f", r.identical); }},
        {"KV allocated", true, [](const SummaryRow & r) { return fmt_bytes(r.kv_bytes); }},
        {"KV / F16 full", true, [](const SummaryRow & r) { return fmt("%.1f%%", 100.0 * r.bytes_ratio); }},
        {"KV peak", true,
         [](const SummaryRow & r) { return std::isfinite(r.kv_peak) ? fmt_bytes(r.kv_peak) : std::string("–"); }},
        {"TTFT (s)", true, [](const SummaryRow & r) { return fmt("%.3f", r.ttft_s); }},
        {"decode tok/s", true, [](const SummaryRow & r) { return fmt("%.1f", r.decode_tps); }},
        {"compress (s)", true, [](const SummaryRow & r) { return fmt("%.3f", r.compress_s); }},
    };
    return cols;
}

std::string xml_escape(const std::string & s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&quot;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

}  // namespace kvlab::eval::report
