// The SVG plot library (svg_plot.h): hand-written SVG 1.1, every number written with one decimal.
#include "eval/svg_plot.h"

#include <algorithm>
#include <cmath>

#include "eval/report_format.h"

namespace kvlab::eval::svg {

using report::fmt;
using report::xml_escape;

namespace {

constexpr double kWidth = 640, kHeight = 400;
constexpr double kLeft = 72, kRight = 480, kTop = 44, kBottom = 346;  // the plot area
const char * const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string num(double v) {
    return fmt("%.1f", std::isfinite(v) ? v : 0.0);
}

}  // namespace

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

Axis time_axis(double lo, double hi) {
    if (!std::isfinite(lo) || !std::isfinite(hi)) return nice_axis(0.0, 1.0, true);
    const double pad = hi > lo ? 0.1 * (hi - lo) : 0.1 * std::fabs(hi);
    return nice_axis(std::max(0.0, lo - pad), hi + pad, lo - pad <= 0.0);
}

std::string method_color(size_t i) {
    return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
}

Plot::Plot(const std::string & title, const std::string & xlabel, const std::string & ylabel, Axis x, Axis y)
    : x_(x), y_(y) {
    out_ +=
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"640\" height=\"400\" "
        "viewBox=\"0 0 640 400\" font-family=\"sans-serif\" font-size=\"12\">\n";
    out_ += "<rect x=\"0\" y=\"0\" width=\"640\" height=\"400\" fill=\"#ffffff\"/>\n";
    out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" " +
            "font-weight=\"bold\">" + xml_escape(title) + "</text>\n";
    axes(xlabel, ylabel);
}

double Plot::px(double x) const {
    return kLeft + (x - x_.lo) / (x_.hi - x_.lo) * (kRight - kLeft);
}

double Plot::py(double y) const {
    return kBottom - (y - y_.lo) / (y_.hi - y_.lo) * (kBottom - kTop);
}

bool Plot::finite(const Point & p) {
    return std::isfinite(p.x) && std::isfinite(p.y);
}

void Plot::line_series(const Series & s) {
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

void Plot::reference(const std::string & name, double y) {
    if (!std::isfinite(y)) return;
    out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(py(y)) + "\" x2=\"" + num(kRight) + "\" y2=\"" + num(py(y)) +
            "\" stroke=\"" + kFullColor + "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
    legend(name, kFullColor, Swatch::dashed);
}

void Plot::scatter(const Series & s, bool square) {
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

void Plot::note(const std::string & msg) {
    out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num((kTop + kBottom) / 2) +
            "\" text-anchor=\"middle\" fill=\"#777777\">" + xml_escape(msg) + "</text>\n";
}

std::string Plot::finish() {
    return out_ + "</svg>\n";
}

std::string Plot::circle(const Point & p, const std::string & color) const {
    return "<circle cx=\"" + num(px(p.x)) + "\" cy=\"" + num(py(p.y)) + "\" r=\"3.5\" fill=\"" + color +
           "\" stroke=\"#ffffff\" stroke-width=\"0.8\"/>\n";
}

void Plot::axes(const std::string & xlabel, const std::string & ylabel) {
    const auto ticks = [](const Axis & a) {
        std::vector<double> t;
        const int n = int(std::lround((a.hi - a.lo) / a.step));
        for (int i = 0; i <= n && i <= 50; ++i) t.push_back(a.lo + a.step * i);
        return t;
    };
    const std::string grid = "stroke=\"#e0e0e0\" stroke-width=\"1\"";
    for (double t : ticks(x_)) {
        const std::string x = num(px(t));
        out_ += "<line x1=\"" + x + "\" y1=\"" + num(kTop) + "\" x2=\"" + x + "\" y2=\"" + num(kBottom) + "\" " + grid +
                "/>\n";
        out_ += "<line x1=\"" + x + "\" y1=\"" + num(kBottom) + "\" x2=\"" + x + "\" y2=\"" + num(kBottom + 5) +
                "\" stroke=\"#000000\"/>\n";
        out_ += "<text x=\"" + x + "\" y=\"" + num(kBottom + 18) + "\" text-anchor=\"middle\">" +
                fmt(("%." + std::to_string(x_.decimals) + "f").c_str(), t) + "</text>\n";
    }
    for (double t : ticks(y_)) {
        const std::string y = num(py(t));
        out_ += "<line x1=\"" + num(kLeft) + "\" y1=\"" + y + "\" x2=\"" + num(kRight) + "\" y2=\"" + y + "\" " + grid +
                "/>\n";
        out_ += "<line x1=\"" + num(kLeft - 5) + "\" y1=\"" + y + "\" x2=\"" + num(kLeft) + "\" y2=\"" + y +
                "\" stroke=\"#000000\"/>\n";
        out_ += "<text x=\"" + num(kLeft - 8) + "\" y=\"" + num(py(t) + 4) + "\" text-anchor=\"end\">" +
                fmt(("%." + std::to_string(y_.decimals) + "f").c_str(), t) + "</text>\n";
    }
    out_ += "<rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(kRight - kLeft) + "\" height=\"" +
            num(kBottom - kTop) + "\" fill=\"none\" stroke=\"#000000\"/>\n";
    out_ += "<text x=\"" + num((kLeft + kRight) / 2) + "\" y=\"" + num(kHeight - 14) + "\" text-anchor=\"middle\">" +
            xml_escape(xlabel) + "</text>\n";
    const std::string cy = num((kTop + kBottom) / 2);
    out_ += "<text x=\"18\" y=\"" + cy + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + cy + ")\">" +
            xml_escape(ylabel) + "</text>\n";
}

void Plot::legend(const std::string & name, const std::string & color, Swatch swatch) {
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

void Plot::label(double x, double y, const std::string & text, const std::string & color) {
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

}  // namespace kvlab::eval::svg
