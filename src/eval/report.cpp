// Reports from result records: the summary per (method, budget label), a markdown table,
// hand-written SVG 1.1 plots and a self-contained HTML page.
//
// Records are read defensively: a missing or non-numeric field is left out of its mean
// (a mean of nothing is 0), so every number written is finite.
#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <utility>

#include "kvlab/error.h"

namespace kvlab::eval {
namespace {

using nlohmann::json;

// ---- record access ----------------------------------------------------------------------

const json * field(const json & j, const char * key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

// A number (or a bool as 0/1); NaN when absent or of another type.
double number(const json & j, const char * key) {
    const json * v = field(j, key);
    if (!v) return NAN;
    if (v->is_number()) return v->get<double>();
    if (v->is_boolean()) return v->get<bool>() ? 1.0 : 0.0;
    return NAN;
}

std::string text(const json & j, const char * key, const std::string & fallback) {
    const json * v = field(j, key);
    return v && v->is_string() ? v->get<std::string>() : fallback;
}

struct Mean {
    double sum = 0.0;
    int64_t n = 0;
    void add(double v) {
        if (std::isfinite(v)) sum += v, ++n;
    }
    double get() const { return n > 0 ? sum / double(n) : 0.0; }
};

// ---- number formatting ------------------------------------------------------------------

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

struct Column {
    const char * name;
    bool numeric;
    std::function<std::string(const SummaryRow &)> cell;
};

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

// ---- SVG plots --------------------------------------------------------------------------

constexpr double kWidth = 640, kHeight = 400;
constexpr double kLeft = 72, kRight = 480, kTop = 44, kBottom = 346;  // the plot area
const char * const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char * const kFullColor = "#000000";

struct Axis {
    double lo = 0.0, hi = 1.0, step = 0.2;
    int decimals = 1;
};

// A range with "nice" ticks (1, 2, 5 x 10^k) covering [lo, hi]; never empty.
Axis nice_axis(double lo, double hi, bool from_zero) {
    if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi) lo = 0.0, hi = 1.0;
    if (from_zero) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
    if (hi - lo <= 1e-12 * std::max(1.0, std::fabs(hi))) {
        const double pad = hi == 0.0 ? 1.0 : std::fabs(hi) * 0.1;
        hi += pad;
        if (!(from_zero && lo >= 0.0)) lo -= pad;
    }
    const double raw = (hi - lo) / 5.0;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double m = raw / mag;
    const double step = (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * mag;
    Axis a;
    a.step = step;
    a.lo = std::floor(lo / step + 1e-9) * step;
    a.hi = std::ceil(hi / step - 1e-9) * step;
    if (a.hi <= a.lo) a.hi = a.lo + step;
    a.decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
    return a;
}

// TTFT spans little of [0, max] when methods differ by little: the data's range, padded by
// a tenth of it each side (of 10% of the value when all equal), at or above 0.
Axis time_axis(double lo, double hi) {
    if (!std::isfinite(lo) || !std::isfinite(hi)) return nice_axis(0.0, 1.0, true);
    const double pad = hi > lo ? 0.1 * (hi - lo) : 0.1 * std::fabs(hi);
    return nice_axis(std::max(0.0, lo - pad), hi + pad, lo - pad <= 0.0);
}

std::string num(double v) {
    return fmt("%.1f", std::isfinite(v) ? v : 0.0);
}

struct Point {
    double x, y;
    std::string label;
};
struct Series {
    std::string name, color;
    std::vector<Point> points;
};

class Plot {
public:
    Plot(const std::string & title, const std::string & xlabel, const std::string & ylabel, Axis x, Axis y)
        : x_(x), y_(y) {
        out_ +=
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"640\" height=\"400\" "
            "viewBox=\"0 0 640 400\" font-family=\"sans-serif\" font-size=\"12\">\n";
        out_ += "<rect x=\"0\" y=\"0\" width=\"640\" height=\"400\" fill=\"#ffffff\"/>\n";
        out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" " +
                "font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
        axes(xlabel, ylabel);
    }
    double px(double x) const { return kLeft + (x - x_.lo) / (x_.hi - x_.lo) * (kRight - kLeft); }
    double py(double y) const { return kBottom - (y - y_.lo) / (y_.hi - y_.lo) * (kBottom - kTop); }
    static bool finite(const Point & p) { return std::isfinite(p.x) && std::isfinite(p.y); }

    void line_series(const Series & s) {
        std::string pts;
        for (const Point & p : s.points)
            if (finite(p)) pts += (pts.empty() ? "" : " ") + num(px(p.x)) + "," + num(py(p.y));
        out_ += "<g><title>" + xml_escape(s.name) + "</title>\n";
        out_ += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
        for (const Point & p : s.points)
            if (finite(p)) out_ += circle(p, s.color);
        out_ += "</g>\n";
        legend(s.name, s.color, Swatch::line);
    }
    // The full cache: a dashed horizontal line at y.
    void reference(const std::string & name, double y) {
        if (!std::isfinite(y)) return;
        out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(py(y)) + "\" x2=\"" + num(kRight) + "\" y2=\"" +
                num(py(y)) + "\" stroke=\"" + kFullColor + "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
        legend(name, kFullColor, Swatch::dashed);
    }
    // Markers with a text label each; the full cache as a square.
    void scatter(const Series & s, bool square) {
        for (const Point & p : s.points) {
            if (!finite(p)) continue;
            out_ += "<g><title>" + xml_escape(s.name + " " + p.label) + "</title>";
            if (square)
                out_ += "<rect x=\"" + num(px(p.x) - 4.5) + "\" y=\"" + num(py(p.y) - 4.5) +
                        "\" width=\"9\" height=\"9\" fill=\"" + s.color + "\"/>\n";
            else
                out_ += circle(p, s.color);
            out_ += "</g>\n";
            label(px(p.x), py(p.y), p.label, s.color);
        }
        legend(s.name, s.color, square ? Swatch::square : Swatch::dot);
    }
    void note(const std::string & msg) {
        out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num((kTop + kBottom) / 2) +
                "\" text-anchor=\"middle\" fill=\"#777777\">" + xml_escape(msg) + "</text>\n";
    }
    std::string finish() { return out_ + "</svg>\n"; }

private:
    std::string circle(const Point & p, const std::string & color) const {
        return "<circle cx=\"" + num(px(p.x)) + "\" cy=\"" + num(py(p.y)) + "\" r=\"3.5\" fill=\"" + color +
               "\" stroke=\"#ffffff\" stroke-width=\"0.8\"/>\n";
    }
    void axes(const std::string & xlabel, const std::string & ylabel) {
        const auto ticks = [](const Axis & a) {
            std::vector<double> t;
            const int n = int(std::lround((a.hi - a.lo) / a.step));
            for (int i = 0; i <= n && i <= 50; ++i) t.push_back(a.lo + a.step * i);
            return t;
        };
        const std::string grid = "stroke=\"#e0e0e0\" stroke-width=\"1\"";
        for (double t : ticks(x_)) {
            const std::string x = num(px(t));
            out_ += "<line x1=\"" + x + "\" y1=\"" + num(kTop) + "\" x2=\"" + x + "\" y2=\"" + num(kBottom) + "\" " +
                    grid + "/>\n";
            out_ += "<line x1=\"" + x + "\" y1=\"" + num(kBottom) + "\" x2=\"" + x + "\" y2=\"" + num(kBottom + 5) +
                    "\" stroke=\"#000000\"/>\n";
            out_ += "<text x=\"" + x + "\" y=\"" + num(kBottom + 18) + "\" text-anchor=\"middle\">" +
                    fmt(("%." + std::to_string(x_.decimals) + "f").c_str(), t) + "</text>\n";
        }
        for (double t : ticks(y_)) {
            const std::string y = num(py(t));
            out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + y + "\" x2=\"" + num(kRight) + "\" y2=\"" + y + "\" " +
                    grid + "/>\n";
            out_ += "<line x1=\"" + num(kLeft - 5) + "\" y1=\"" + y + "\" x2=\"" + num(kLeft) + "\" y2=\"" + y +
                    "\" stroke=\"#000000\"/>\n";
            out_ += "<text x=\"" + num(kLeft - 8) + "\" y=\"" + num(py(t) + 4) + "\" text-anchor=\"end\">" +
                    fmt(("%." + std::to_string(y_.decimals) + "f").c_str(), t) + "</text>\n";
        }
        out_ += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kRight - kLeft) +
                "\" height=\"" + num(kBottom - kTop) + "\" fill=\"none\" stroke=\"#000000\"/>\n";
        out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num(kHeight - 14) +
                "\" text-anchor=\"middle\">" + xml_escape(xlabel) + "</text>\n";
        const std::string cy = num((kTop + kBottom) / 2);
        out_ += "<text x=\"18\" y=\"" + cy + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + cy + ")\">" +
                xml_escape(ylabel) + "</text>\n";
    }
    // Legend swatches are never circles, so a plot's circles are its data points.
    enum class Swatch { line, dashed, square, dot };
    void legend(const std::string & name, const std::string & color, Swatch swatch) {
        const double y = kTop + 8 + 18 * n_legend_++;
        const double x = kRight + 16;
        if (swatch == Swatch::square || swatch == Swatch::dot)
            out_ += "<rect x=\"" + num(x + 6) + "\" y=\"" + num(y - 4.5) + "\" width=\"9\" height=\"9\" " +
                    (swatch == Swatch::dot ? "rx=\"4.5\" " : "") + "fill=\"" + color + "\"/>\n";
        else
            out_ += "<line x1=\"" + num(x) + "\" y1=\"" + num(y) + "\" x2=\"" + num(x + 20) + "\" y2=\"" + num(y) +
                    "\" stroke=\"" + color + "\" stroke-width=\"" +
                    (swatch == Swatch::dashed ? "1.5\" stroke-dasharray=\"6,4" : "3") + "\"/>\n";
        out_ += "<text x=\"" + num(x + 26) + "\" y=\"" + num(y + 4) + "\">" + xml_escape(name) + "</text>\n";
    }

    // A point's label at the first of a few places around it that overlaps no earlier label
    // and stays in the plot; none when all do (the marker's tooltip still names it).
    void label(double x, double y, const std::string & text, const std::string & color) {
        const double w = 5.6 * double(text.size()), h = 11.0;  // estimated at font-size 10
        const double cand[][2] = {{7, -5}, {7, 14}, {-7 - w, -5}, {-7 - w, 14}, {-w / 2, -8}, {-w / 2, 18}};
        for (const auto & c : cand) {
            const Box b{x + c[0], y + c[1] - h + 2, w, h};  // text baseline at y + c[1]
            if (b.x < kLeft || b.x + b.w > kRight || b.y < kTop || b.y + b.h > kBottom) continue;
            if (std::any_of(labels_.begin(), labels_.end(), [&](const Box & o) { return o.overlaps(b); })) continue;
            labels_.push_back(b);
            out_ += "<text x=\"" + num(x + c[0]) + "\" y=\"" + num(y + c[1]) + "\" font-size=\"10\" fill=\"" + color +
                    "\">" + xml_escape(text) + "</text>\n";
            return;
        }
    }
    struct Box {
        double x, y, w, h;
        bool overlaps(const Box & o) const { return x < o.x + o.w && o.x < x + w && y < o.y + o.h && o.y < y + h; }
    };

    Axis x_, y_;
    std::string out_;
    int n_legend_ = 0;
    std::vector<Box> labels_;
};

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

std::string method_color(size_t i) {
    return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
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

std::vector<SummaryRow> summarize(const std::vector<json> & answer_records) {
    struct Group {
        SummaryRow row;
        Mean ratio, score, kl, top1, identical, kv, ttft, tps, compress, first, later, bytes, budget_bytes, peak;
    };
    std::map<std::pair<std::string, std::string>, Group> groups;
    for (const json & rec : answer_records) {
        if (!rec.is_object()) continue;
        if (field(rec, "kind") && text(rec, "kind", "") != "answer") continue;
        // query-aware runs are their own rows: "snapkv (query-aware)", "snapkv (multi-turn)"
        const json * qa = field(rec, "query_aware");
        const json * mt = field(rec, "multi_turn");
        const std::string method =
            text(rec, "method", "?") + (mt && mt->is_boolean() && mt->get<bool>()   ? " (multi-turn)"
                                        : qa && qa->is_boolean() && qa->get<bool>() ? " (query-aware)"
                                                                                    : "");
        const std::string budget = text(rec, "budget_label", method == "none" ? "full" : "?");
        Group & g = groups[{method, budget}];
        g.row.method = method;
        g.row.budget = budget;
        g.row.policy = text(rec, "policy", "");
        g.bytes.add(number(rec, "kv_bytes_ratio"));
        g.budget_bytes.add(number(rec, "budget_bytes_ratio"));
        ++g.row.n;
        double ratio = number(rec, "achieved_ratio");
        if (!std::isfinite(ratio)) ratio = number(rec, "ratio");
        g.ratio.add(ratio);
        g.score.add(number(rec, "score"));
        (number(rec, "question_index") > 0 ? g.later : g.first).add(number(rec, "score"));
        g.row.n_later += number(rec, "question_index") > 0;
        static const json empty = json::object();
        const json * fid = field(rec, "fidelity");
        const json & f = fid ? *fid : empty;
        g.kl.add(number(f, "kl_mean"));
        g.top1.add(number(f, "top1_agreement"));
        g.identical.add(number(f, "identical"));
        g.kv.add(number(rec, "kv_allocated_bytes"));
        g.peak.add(number(rec, "kv_peak_bytes"));
        g.ttft.add(number(rec, "ttft_s"));
        g.tps.add(number(rec, "decode_tokens_per_s"));
        g.compress.add(number(rec, "compress_s"));
    }
    std::vector<SummaryRow> rows;
    for (auto & [key, g] : groups) {
        SummaryRow r = g.row;
        r.ratio = g.ratio.get();
        r.score = g.score.get();
        r.kl = g.kl.get();
        r.top1 = g.top1.get();
        r.identical = g.identical.get();
        r.kv_bytes = g.kv.get();
        r.kv_peak = g.peak.n > 0 ? g.peak.get() : NAN;
        r.ttft_s = g.ttft.get();
        r.decode_tps = g.tps.get();
        r.compress_s = g.compress.get();
        r.score_first = g.first.get();
        r.score_later = r.n_later > 0 ? g.later.get() : NAN;
        r.bytes_ratio = g.bytes.n > 0 ? g.bytes.get() : NAN;
        r.budget_bytes_ratio = g.budget_bytes.n > 0 ? g.budget_bytes.get() : NAN;
        rows.push_back(std::move(r));
    }
    std::stable_sort(rows.begin(), rows.end(), [](const SummaryRow & a, const SummaryRow & b) {
        const bool fa = a.method == "none", fb = b.method == "none";
        if (fa != fb) return fa;
        if (a.method != b.method) return a.method < b.method;
        if (a.ratio != b.ratio) return a.ratio < b.ratio;
        return a.budget < b.budget;
    });
    return rows;
}

std::string best_per_ratio(const std::vector<SummaryRow> & rows) {
    std::map<std::string, const SummaryRow *> best;  // budget label -> best row
    for (const SummaryRow & r : rows) {
        if (r.method.rfind("none", 0) == 0) continue;
        const SummaryRow *& b = best[r.budget];
        if (!b || r.score > b->score || (r.score == b->score && r.kl < b->kl)) b = &r;
    }
    const SummaryRow * full = nullptr;
    for (const SummaryRow & r : rows)
        if (r.method == "none") full = &r;
    std::string out;
    for (const auto & [budget, r] : best)
        out += "- best at " + budget + ": " + r->method + " (score " + fmt("%.3f", r->score) +
               (full ? " vs " + fmt("%.3f", full->score) + " for the full cache" : std::string()) + ", KL " +
               fmt("%.4g", r->kl) + ")\n";
    return out;
}

std::string best_per_bytes(const std::vector<SummaryRow> & rows) {
    std::vector<double> budgets;
    for (const SummaryRow & r : rows)
        if (std::isfinite(r.budget_bytes_ratio) &&
            std::find(budgets.begin(), budgets.end(), r.budget_bytes_ratio) == budgets.end())
            budgets.push_back(r.budget_bytes_ratio);
    std::sort(budgets.begin(), budgets.end());
    const SummaryRow * full = nullptr;
    for (const SummaryRow & r : rows)
        if (r.method == "none" && (!full || r.budget == "full")) full = &r;
    const auto better = [](const SummaryRow * a, const SummaryRow & r) {
        return !a || r.score > a->score || (r.score == a->score && r.kl < a->kl);
    };
    const auto name = [](const SummaryRow & r) {
        return r.method + " (" + r.budget + (r.policy.empty() ? "" : ", " + r.policy) + ")";
    };
    std::string out;
    for (const double B : budgets) {
        // the best of each policy family: F16 rows evicted, quantized rows evicted, rows demoted
        const SummaryRow * best = nullptr;
        const SummaryRow * family[3] = {nullptr, nullptr, nullptr};
        for (const SummaryRow & r : rows) {
            if (!std::isfinite(r.bytes_ratio) || r.bytes_ratio > B * (1.0 + 1e-9)) continue;
            if (better(best, r)) best = &r;
            if (r.method.rfind("none", 0) == 0) continue;
            const bool evicts = r.policy.size() >= 6 && r.policy.compare(r.policy.size() - 6, 6, " evict") == 0;
            const int f = !evicts ? 2 : r.policy == "f16 evict" ? 0 : 1;
            if (better(family[f], r)) family[f] = &r;
        }
        out += "- best within " + fmt("%.1f%%", 100.0 * B) + " of the F16 full cache's bytes: ";
        if (!best) {
            out += "nothing fits\n";
            continue;
        }
        out +=
            name(*best) + ", score " + fmt("%.3f", best->score) +
            (full && full->score > 0.0 ? " (" + fmt("%.2f", best->score / full->score) + "x the full cache's)" : "") +
            ", KL " + fmt("%.4g", best->kl) + ", " + fmt("%.1f%%", 100.0 * best->bytes_ratio) + " of the bytes";
        const char * what[3] = {"F16 rows evicted", "quantized rows evicted", "rows demoted"};
        std::string parts;
        for (int f = 0; f < 3; ++f)
            if (family[f])
                parts += std::string(parts.empty() ? "" : ", ") + what[f] + " " + fmt("%.3f", family[f]->score) + " (" +
                         family[f]->method + ", " + family[f]->policy + ")";
        if (!parts.empty()) out += "; at best: " + parts;
        out += "\n";
    }
    return out;
}

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
