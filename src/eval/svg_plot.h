// A small SVG 1.1 plot library for the report's figures (report.cpp): a 640 x 400 canvas with a
// title, a plot area with "nice" axes, grid and tick labels, polylines with their points, dashed
// reference lines, labelled markers and a legend beside the plot area.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvlab::eval::svg {

struct Axis {
    double lo = 0.0, hi = 1.0, step = 0.2;
    int decimals = 1;
};

// A range with "nice" ticks (1, 2, 5 x 10^k) covering [lo, hi]; never empty.
Axis nice_axis(double lo, double hi, bool from_zero);
// TTFT spans little of [0, max] when methods differ by little: the data's range, padded by
// a tenth of it each side (of 10% of the value when all equal), at or above 0.
Axis time_axis(double lo, double hi);

struct Point {
    double x, y;
    std::string label;
};
struct Series {
    std::string name, color;
    std::vector<Point> points;
};

// The full cache's colour, and the palette's i-th colour (cycled) for the other series.
constexpr const char * kFullColor = "#000000";
std::string method_color(size_t i);

class Plot {
public:
    Plot(const std::string & title, const std::string & xlabel, const std::string & ylabel, Axis x, Axis y);
    double px(double x) const;  // plot coordinates -> SVG coordinates
    double py(double y) const;
    static bool finite(const Point & p);

    void line_series(const Series & s);
    // The full cache: a dashed horizontal line at y.
    void reference(const std::string & name, double y);
    // Markers with a text label each; the full cache as a square.
    void scatter(const Series & s, bool square);
    void note(const std::string & msg);
    std::string finish();

private:
    // Legend swatches are never circles, so a plot's circles are its data points.
    enum class Swatch { line, dashed, square, dot };
    struct Box {
        double x, y, w, h;
        bool overlaps(const Box & o) const { return x < o.x + o.w && o.x < x + w && y < o.y + o.h && o.y < y + h; }
    };

    std::string circle(const Point & p, const std::string & color) const;
    void axes(const std::string & xlabel, const std::string & ylabel);
    void legend(const std::string & name, const std::string & color, Swatch swatch);
    // A point's label at the first of a few places around it that overlaps no earlier label
    // and stays in the plot; none when all do (the marker's tooltip still names it).
    void label(double x, double y, const std::string & text, const std::string & color);

    Axis x_, y_;
    std::string out_;
    int n_legend_ = 0;
    std::vector<Box> labels_;
};

}  // namespace kvlab::eval::svg
