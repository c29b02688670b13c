// Evaluation metrics (eval/metrics.h) on hand-checked cases from RULER's and SQuAD v1.1's
// definitions, KL and fidelity on hand-computed logits; reports (eval/report.h) on
// synthetic records: grouping, order, means, the markdown table, the SVG plots (parsed with
// tinyxml2), the HTML page (rendered by headless chromium where installed: its DOM must hold
// the markdown table's cells) and JSONL reading.
#include <gtest/gtest.h>
#include <tinyxml2.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "eval/metrics.h"
#include "eval/report.h"
#include "kvlab/error.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

using eval::SummaryRow;
using nlohmann::json;
using Refs = std::vector<std::string>;

size_t count(const std::string & s, const std::string & what) {
    size_t n = 0;
    for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + what.size())) ++n;
    return n;
}

// "nan" or "inf" as a word (printf's spelling of non-finite numbers), not inside "provenance".
bool has_nonfinite(const std::string & s) {
    const auto alpha = [&](size_t i) { return i < s.size() && std::isalpha((unsigned char)s[i]); };
    for (const char * w : {"nan", "inf"}) {
        for (size_t i = s.find(w); i != std::string::npos; i = s.find(w, i + 1))
            if ((i == 0 || !alpha(i - 1)) && !alpha(i + 3)) return true;
    }
    return false;
}

std::string error_of(const std::function<void()> & f) {
    try {
        f();
    } catch (const Error & e) {
        return e.what();
    }
    return "";
}

// ---- metrics ----------------------------------------------------------------------------

TEST(EvalMetrics, StringMatchAllAndPart) {
    const Refs refs = {"alpha", "Beta", "gamma"};
    EXPECT_DOUBLE_EQ(eval::string_match_all("ALPHA and beta here", refs), 2.0 / 3.0);
    EXPECT_DOUBLE_EQ(eval::string_match_part("ALPHA and beta here", refs), 1.0);
    EXPECT_DOUBLE_EQ(eval::string_match_all("alpha beta gamma", refs), 1.0);
    EXPECT_DOUBLE_EQ(eval::string_match_part("delta", refs), 0.0);
    EXPECT_DOUBLE_EQ(eval::string_match_all("delta", refs), 0.0);
    // substring, not word match (RULER's `r.lower() in pred.lower()`)
    EXPECT_DOUBLE_EQ(eval::string_match_all("the number is 1234567.", {"34567"}), 1.0);
    EXPECT_DOUBLE_EQ(eval::string_match_all("anything", {}), 0.0);
    EXPECT_DOUBLE_EQ(eval::string_match_part("anything", {}), 0.0);
}

TEST(EvalMetrics, NormalizeAnswer) {
    EXPECT_EQ(eval::normalize_answer("The Eiffel  Tower!"), "eiffel tower");
    EXPECT_EQ(eval::normalize_answer("  a cat, an owl and THE dog. "), "cat owl and dog");
    // articles only as whole words; punctuation goes before articles are found
    EXPECT_EQ(eval::normalize_answer("theater anatomy banana"), "theater anatomy banana");
    EXPECT_EQ(eval::normalize_answer("the-end"), "theend");
    EXPECT_EQ(eval::normalize_answer("(a)"), "");
    EXPECT_EQ(eval::normalize_answer("tab\tand\nnewline"), "tab and newline");
    EXPECT_EQ(eval::normalize_answer(""), "");
}

TEST(EvalMetrics, ExactMatch) {
    EXPECT_DOUBLE_EQ(eval::exact_match("the Eiffel Tower!", {"Eiffel tower"}), 1.0);
    EXPECT_DOUBLE_EQ(eval::exact_match("Eiffel", {"Eiffel tower"}), 0.0);
    EXPECT_DOUBLE_EQ(eval::exact_match("Paris", {"London", "paris."}), 1.0);  // best over refs
    EXPECT_DOUBLE_EQ(eval::exact_match("Paris", {}), 0.0);
    EXPECT_DOUBLE_EQ(eval::exact_match("", {""}), 1.0);      // SQuAD v1.1: "" == ""
    EXPECT_DOUBLE_EQ(eval::exact_match("the", {"a"}), 1.0);  // both normalise to ""
}

TEST(EvalMetrics, TokenF1) {
    EXPECT_NEAR(eval::token_f1("x b c", {"b c d"}), 2.0 / 3.0, 1e-12);  // p = r = 2/3
    // "a" is an article, so SQuAD compares {b, c} with {b, c, d}: p = 1, r = 2/3, F1 = 0.8
    EXPECT_NEAR(eval::token_f1("a b c", {"b c d"}), 0.8, 1e-12);
    EXPECT_NEAR(eval::token_f1("x y b", {"b c d e"}), 2 * (1.0 / 3) * (1.0 / 4) / (1.0 / 3 + 1.0 / 4), 1e-12);
    EXPECT_DOUBLE_EQ(eval::token_f1("The Eiffel Tower", {"eiffel tower!"}), 1.0);
    // multiset overlap: "b b" vs "b": common 1, p = 1/2, r = 1
    EXPECT_NEAR(eval::token_f1("b b", {"b"}), 2.0 / 3.0, 1e-12);
    EXPECT_DOUBLE_EQ(eval::token_f1("x", {"y", "x z"}), 2 * 1.0 * 0.5 / 1.5);  // best over refs
    // SQuAD v1.1: no common token (also an empty side) is 0
    EXPECT_DOUBLE_EQ(eval::token_f1("", {"x"}), 0.0);
    EXPECT_DOUBLE_EQ(eval::token_f1("x", {""}), 0.0);
    EXPECT_DOUBLE_EQ(eval::token_f1("", {""}), 0.0);
    EXPECT_DOUBLE_EQ(eval::token_f1("x", {}), 0.0);
}

TEST(EvalMetrics, ScoreDispatch) {
    const Refs refs = {"alpha", "beta"};
    EXPECT_DOUBLE_EQ(eval::score("string_match_all", "alpha", refs), 0.5);
    EXPECT_DOUBLE_EQ(eval::score("string_match_part", "alpha", refs), 1.0);
    EXPECT_DOUBLE_EQ(eval::score("exact_match", "Alpha.", refs), 1.0);
    EXPECT_NEAR(eval::score("f1", "alpha gamma", refs), 2.0 / 3.0, 1e-12);
    const std::string msg = error_of([&] { eval::score("bleu", "x", refs); });
    EXPECT_NE(msg.find("[eval]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unknown metric 'bleu'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("string_match_all"), std::string::npos) << msg;
}

TEST(EvalMetrics, KlDivergence) {
    const std::vector<float> a = {0.5f, -1.0f, 3.0f, 2.0f};
    EXPECT_NEAR(eval::kl_divergence(a.data(), a.data(), 4), 0.0, 1e-15);
    // p = (1/2, 1/2), q = (1/4, 3/4)
    const float p[2] = {0.0f, 0.0f};
    const float q[2] = {0.0f, float(std::log(3.0))};
    const double want = 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0);
    EXPECT_NEAR(eval::kl_divergence(p, q, 2), want, 1e-7);
    // invariant to a constant added to either row; large logits stay finite
    const float p2[2] = {100.0f, 100.0f};
    const float q2[2] = {-50.0f, -50.0f + float(std::log(3.0))};
    EXPECT_NEAR(eval::kl_divergence(p2, q2, 2), want, 1e-5);
    const float p3[2] = {1000.0f, 0.0f};
    const float q3[2] = {0.0f, 1000.0f};
    EXPECT_NEAR(eval::kl_divergence(p3, q3, 2), 1000.0, 1e-6);
    // asymmetric in general
    EXPECT_NE(eval::kl_divergence(p, q, 2), eval::kl_divergence(q, p, 2));
}

TEST(EvalMetrics, Fidelity) {
    const float l3 = float(std::log(3.0));
    // rows: identical; p=(.5,.5) q=(.25,.75) (argmax 0 vs 1); p=(1,0)-ish vs q same argmax
    const std::vector<float> full = {1.0f, 2.0f, 0.0f, 0.0f, 5.0f, 0.0f};
    const std::vector<float> comp = {1.0f, 2.0f, 0.0f, l3, 4.0f, 0.0f};
    const eval::Fidelity f = eval::fidelity(full, comp, 2);
    EXPECT_EQ(f.n_positions, 3);
    const double kl1 = 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0);
    const float r3p[2] = {5.0f, 0.0f}, r3q[2] = {4.0f, 0.0f};
    const double kl2 = eval::kl_divergence(r3p, r3q, 2);
    EXPECT_NEAR(f.kl_mean, (0.0 + kl1 + kl2) / 3.0, 1e-7);
    EXPECT_NEAR(f.kl_max, std::max(kl1, kl2), 1e-7);
    EXPECT_NEAR(f.top1_agreement, 2.0 / 3.0, 1e-12);  // row 2: tie (0,0) -> index 0 vs 1

    const eval::Fidelity same = eval::fidelity(full, full, 2);
    EXPECT_EQ(same.kl_max, 0.0);
    EXPECT_EQ(same.top1_agreement, 1.0);

    const eval::Fidelity none = eval::fidelity({}, {}, 8);
    EXPECT_EQ(none.n_positions, 0);

    EXPECT_THROW(eval::fidelity(full, std::vector<float>(4), 2), Error);
    EXPECT_THROW(eval::fidelity(full, comp, 4), Error);  // 6 is not a multiple of 4
    EXPECT_THROW(eval::fidelity(full, comp, 0), Error);
}

// ---- reports ----------------------------------------------------------------------------

json answer(const std::string & method, const std::string & budget, double achieved, double score, double kl,
            double top1, bool identical, double kv_bytes, double ttft) {
    return {{"kind", "answer"},
            {"sample_id", "s"},
            {"task", "niah"},
            {"question_index", 0},
            {"method", method},
            {"budget_label", budget},
            {"ratio", method == "none" ? json(0.0) : json(nullptr)},
            {"achieved_ratio", achieved},
            {"score", score},
            {"metric", "string_match_all"},
            {"answer", "x"},
            {"references", {"x"}},
            {"fidelity",
             {{"kl_mean", kl}, {"kl_max", kl}, {"top1_agreement", top1}, {"n_positions", 4}, {"identical", identical}}},
            {"kv_allocated_bytes", kv_bytes},
            {"kv_used_bytes", kv_bytes},
            {"context_tokens", 1000},
            {"prefill_s", 0.5},
            {"compress_s", 0.01},
            {"ttft_s", ttft},
            {"decode_s", 1.0},
            {"decode_tokens_per_s", 20.0},
            {"peak_rss_bytes", 1 << 30},
            {"params", json::object()}};
}

std::vector<json> synthetic_records() {
    return {
        answer("snapkv", "ratio 0.75", 0.74, 0.0, 0.8, 0.5, false, 2 << 20, 0.30),
        answer("none", "full", 0.0, 1.0, 0.0, 1.0, true, 8 << 20, 0.50),
        answer("knorm", "ratio 0.5", 0.5, 1.0, 0.2, 0.75, false, 4 << 20, 0.40),
        answer("snapkv", "ratio 0.5", 0.52, 1.0, 0.1, 1.0, true, 4 << 20, 0.41),
        answer("snapkv", "ratio 0.5", 0.48, 0.5, 0.3, 0.5, false, 4 << 20, 0.39),
        answer("none", "full", 0.0, 0.0, 0.0, 1.0, true, 8 << 20, 0.60),
        {{"kind", "header"}, {"config", json::object()}},  // ignored
        answer("snapkv", "budget 256", 0.9, 0.25, 1.5, 0.25, false, 1 << 20, 0.2),
    };
}

TEST(EvalReport, SummarizeGroupsOrdersAndAverages) {
    const auto rows = eval::summarize(synthetic_records());
    ASSERT_EQ(rows.size(), 5u);
    EXPECT_EQ(rows[0].method, "none");
    EXPECT_EQ(rows[0].budget, "full");
    EXPECT_EQ(rows[0].n, 2);
    EXPECT_DOUBLE_EQ(rows[0].score, 0.5);
    EXPECT_DOUBLE_EQ(rows[0].identical, 1.0);
    EXPECT_DOUBLE_EQ(rows[0].ttft_s, 0.55);
    EXPECT_DOUBLE_EQ(rows[0].kv_bytes, double(8 << 20));
    EXPECT_EQ(rows[1].method, "knorm");
    EXPECT_EQ(rows[2].method, "snapkv");
    EXPECT_EQ(rows[2].budget, "ratio 0.5");  // ascending achieved ratio: 0.5, 0.74, 0.9
    EXPECT_EQ(rows[3].budget, "ratio 0.75");
    EXPECT_EQ(rows[4].budget, "budget 256");
    const SummaryRow & s = rows[2];
    EXPECT_EQ(s.n, 2);
    EXPECT_NEAR(s.ratio, 0.5, 1e-12);
    EXPECT_NEAR(s.score, 0.75, 1e-12);
    EXPECT_NEAR(s.kl, 0.2, 1e-12);
    EXPECT_NEAR(s.top1, 0.75, 1e-12);
    EXPECT_NEAR(s.identical, 0.5, 1e-12);
    EXPECT_NEAR(s.ttft_s, 0.40, 1e-12);
    EXPECT_NEAR(s.decode_tps, 20.0, 1e-12);
    EXPECT_NEAR(s.compress_s, 0.01, 1e-12);

    // missing fields are left out of the means; non-objects are skipped
    const auto sparse = eval::summarize(
        {json{{"kind", "answer"}, {"method", "x"}, {"budget_label", "ratio 0.5"}}, json::array(), json("junk")});
    ASSERT_EQ(sparse.size(), 1u);
    EXPECT_EQ(sparse[0].n, 1);
    EXPECT_EQ(sparse[0].score, 0.0);
    EXPECT_TRUE(eval::summarize({}).empty());
}

TEST(EvalReport, MarkdownTable) {
    const auto rows = eval::summarize(synthetic_records());
    const std::string md = eval::markdown_table(rows);
    EXPECT_EQ(count(md, "\n"), rows.size() + 2);  // header, rule, one line per row
    EXPECT_EQ(md.rfind("| method | budget |", 0), 0u) << md;
    EXPECT_NE(md.find("| none | full |"), std::string::npos) << md;
    EXPECT_NE(md.find("| knorm |"), std::string::npos);
    EXPECT_EQ(count(md, "| snapkv |"), 3u);
    EXPECT_NE(md.find("8.0 MiB"), std::string::npos) << md;
    EXPECT_NE(md.find("0.750"), std::string::npos);  // a score with 3 decimals
    EXPECT_FALSE(has_nonfinite(md));
}

// An SVG as tinyxml2 parsed it: elements counted by name, the contents of every <text> and
// <title>, and the data series (a <g> whose <title> names it, with a polyline and/or markers).
struct SvgTree {
    std::map<std::string, size_t> n;  // elements by name
    std::vector<std::string> texts, titles;
    struct Group {
        std::string title;
        std::vector<std::vector<double>> polylines;  // flattened x,y pairs
        size_t n_circle = 0, n_rect = 0;
    };
    std::vector<Group> groups;
    std::vector<std::string> dashed;  // names of the elements with a stroke-dasharray
    const SvgTree::Group * group(const std::string & title) const {
        for (const Group & g : groups)
            if (g.title == title) return &g;
        return nullptr;
    }
    bool has_text(const std::string & t) const { return std::find(texts.begin(), texts.end(), t) != texts.end(); }
    bool has_title(const std::string & t) const { return std::find(titles.begin(), titles.end(), t) != titles.end(); }
};

// A number attribute: the whole value parses as a finite double.
bool finite_number(const char * v, double * out = nullptr) {
    if (!v || !*v) return false;
    char * end = nullptr;
    const double d = std::strtod(v, &end);
    if (out) *out = d;
    return *end == '\0' && std::isfinite(d);
}

// Parses one SVG document and checks what holds for every plot: well-formed XML (so no raw
// '<' or '&' in a text), one <svg> root in the SVG namespace, every coordinate a finite
// number, every data point (polyline vertex, circle) inside the plot frame (the unfilled
// <rect>), and no "nan"/"inf" in any text; n_polyline and n_circle elements.
SvgTree parse_svg(const std::string & svg, size_t n_polyline, size_t n_circle) {
    SvgTree t;
    tinyxml2::XMLDocument doc;
    const auto err = doc.Parse(svg.c_str(), svg.size());
    EXPECT_EQ(err, tinyxml2::XML_SUCCESS) << doc.ErrorStr() << "\n" << svg;
    const tinyxml2::XMLElement * root = doc.RootElement();
    if (err != tinyxml2::XML_SUCCESS || !root) {
        ADD_FAILURE() << "no SVG root element";
        return t;
    }
    EXPECT_STREQ(root->Name(), "svg");
    EXPECT_STREQ(root->Attribute("xmlns"), "http://www.w3.org/2000/svg");
    EXPECT_STREQ(root->Attribute("viewBox"), "0 0 640 400");
    EXPECT_EQ(root->NextSiblingElement(), nullptr);

    std::vector<std::pair<double, double>> points;  // every data point, checked against the frame below
    double frame[4] = {NAN, NAN, NAN, NAN};         // x0, y0, x1, y1
    const auto walk = [&](const auto & self, const tinyxml2::XMLElement * e, size_t gi) -> void {
        SvgTree::Group * g = gi < t.groups.size() ? &t.groups[gi] : nullptr;  // the enclosing <g>
        const std::string name = e->Name();
        ++t.n[name];
        for (const tinyxml2::XMLAttribute * a = e->FirstAttribute(); a; a = a->Next()) {
            const std::string an = a->Name();
            for (const char * geo : {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "rx", "width", "height"}) {
                if (an == geo) {
                    EXPECT_TRUE(finite_number(a->Value())) << name << " " << an << "=" << a->Value();
                }
            }
            if (an == "stroke-dasharray") t.dashed.push_back(name);
        }
        if (name == "text" || name == "title") {
            const std::string text = e->GetText() ? e->GetText() : "";
            EXPECT_FALSE(has_nonfinite(text)) << text;
            (name == "text" ? t.texts : t.titles).push_back(text);
            if (name == "title" && g) g->title = text;
        }
        if (name == "rect" && e->Attribute("fill", "none")) {
            frame[0] = e->DoubleAttribute("x"), frame[1] = e->DoubleAttribute("y");
            frame[2] = frame[0] + e->DoubleAttribute("width"), frame[3] = frame[1] + e->DoubleAttribute("height");
        }
        if (name == "polyline") {
            std::vector<double> xy;
            std::string pts = e->Attribute("points") ? e->Attribute("points") : "";
            for (char & c : pts)
                if (c == ',') c = ' ';
            std::istringstream in(pts);
            for (std::string v; in >> v;) {
                double d = 0;
                EXPECT_TRUE(finite_number(v.c_str(), &d)) << "polyline point " << v;
                xy.push_back(d);
            }
            EXPECT_EQ(xy.size() % 2, 0u) << pts;
            for (size_t i = 0; i + 1 < xy.size(); i += 2) points.emplace_back(xy[i], xy[i + 1]);
            if (g) g->polylines.push_back(xy);
        }
        if (name == "circle") {
            points.emplace_back(e->DoubleAttribute("cx"), e->DoubleAttribute("cy"));
            if (g) ++g->n_circle;
        }
        if (name == "rect" && g) ++g->n_rect;
        if (name == "g") {
            t.groups.emplace_back();
            gi = t.groups.size() - 1;
        }
        for (const tinyxml2::XMLElement * c = e->FirstChildElement(); c; c = c->NextSiblingElement()) self(self, c, gi);
    };
    walk(walk, root, SIZE_MAX);
    EXPECT_EQ(t.n["svg"], 1u);
    EXPECT_EQ(t.n["polyline"], n_polyline) << svg;
    EXPECT_EQ(t.n["circle"], n_circle) << svg;
    EXPECT_EQ(t.n["g"], t.groups.size());
    EXPECT_TRUE(std::isfinite(frame[0])) << "no plot frame";
    for (const auto & [x, y] : points) {
        EXPECT_GE(x, frame[0]) << "data point left of the frame";
        EXPECT_LE(x, frame[2]) << "data point right of the frame";
        EXPECT_GE(y, frame[1]) << "data point above the frame";
        EXPECT_LE(y, frame[3]) << "data point below the frame";
    }
    return t;
}

TEST(EvalReport, SvgPlots) {
    const auto rows = eval::summarize(synthetic_records());
    // 2 compressing methods: a polyline each with a circle per compressed row (knorm 1,
    // snapkv 3), in a <g> titled by the method; the full cache as a dashed line
    for (const std::string & svg : {eval::svg_score_vs_ratio(rows), eval::svg_kl_vs_ratio(rows)}) {
        const SvgTree t = parse_svg(svg, 2, 4);
        for (const auto & [method, n_points] : {std::pair<std::string, size_t>{"knorm", 1}, {"snapkv", 3}}) {
            const SvgTree::Group * g = t.group(method);
            ASSERT_NE(g, nullptr) << method << "\n" << svg;
            ASSERT_EQ(g->polylines.size(), 1u) << method;
            EXPECT_EQ(g->polylines[0].size(), 2 * n_points) << method;
            EXPECT_EQ(g->n_circle, n_points) << method;
            EXPECT_TRUE(t.has_text(method)) << method << ": no legend entry";
        }
        EXPECT_TRUE(t.has_text("none (full cache)"));
        ASSERT_EQ(t.dashed.size(), 2u);  // the reference line and its legend swatch
        for (const std::string & e : t.dashed) EXPECT_EQ(e, "line");
    }
    // one marker per row, each in a <g> titled "method budget"; the full cache a square
    const SvgTree mem = parse_svg(eval::svg_memory_vs_ttft(rows), 0, 4);
    EXPECT_EQ(mem.groups.size(), rows.size());
    for (const auto & r : rows) {
        const std::string title = (r.method == "none" ? "none (full cache)" : r.method) + " " + r.budget;
        const SvgTree::Group * g = mem.group(title);
        ASSERT_NE(g, nullptr) << title;
        EXPECT_EQ(g->n_circle + g->n_rect, 1u) << title;
        EXPECT_EQ(g->n_rect, r.method == "none" ? 1u : 0u) << title;
    }
    EXPECT_TRUE(mem.has_text("snapkv"));
    EXPECT_TRUE(mem.has_text("ratio 0.75"));  // a point label
    EXPECT_TRUE(mem.has_text("KV allocated (MiB)"));
}

TEST(EvalReport, SvgDegenerateInputs) {
    // no rows, one point, all-equal values, a non-finite value
    parse_svg(eval::svg_score_vs_ratio({}), 0, 0);
    parse_svg(eval::svg_memory_vs_ttft({}), 0, 0);
    SummaryRow one;
    one.method = "solo";
    one.budget = "ratio 0.5";
    one.ratio = 0.5;
    one.score = 0.5;
    one.kl = 0.0;
    one.n = 1;
    parse_svg(eval::svg_score_vs_ratio({one}), 1, 1);
    parse_svg(eval::svg_kl_vs_ratio({one}), 1, 1);
    parse_svg(eval::svg_memory_vs_ttft({one}), 0, 1);
    SummaryRow two = one;
    two.budget = "ratio 0.6";
    SummaryRow full = one;
    full.method = "none";
    full.budget = "full";
    full.ratio = 0.5;
    const SvgTree kl = parse_svg(eval::svg_kl_vs_ratio({full, one, two}), 1, 2);
    ASSERT_NE(kl.group("solo"), nullptr);
    EXPECT_EQ(kl.group("solo")->polylines.at(0).size(), 4u);
    parse_svg(eval::svg_memory_vs_ttft({full, one, two}), 0, 2);
    SummaryRow bad = one;
    bad.score = std::numeric_limits<double>::quiet_NaN();
    bad.ttft_s = std::numeric_limits<double>::infinity();
    // the non-finite point is left out of the line and gets no marker
    const SvgTree sc = parse_svg(eval::svg_score_vs_ratio({one, bad}), 1, 1);
    ASSERT_NE(sc.group("solo"), nullptr);
    EXPECT_EQ(sc.group("solo")->polylines.at(0).size(), 2u);
    parse_svg(eval::svg_memory_vs_ttft({one, bad}), 0, 1);
}

json header_record() {
    return {{"kind", "header"},
            {"config", {{"model", "/models/tiny.gguf"}, {"tasks", {"niah"}}, {"note", "a <b> & \"c\""}}},
            {"provenance",
             {{"model", {{"path", "/models/tiny.gguf"}, {"sha256", "abc123"}, {"file_bytes", 1 << 20}}},
              {"hparams", {{"arch", "qwen3"}}}}},
            {"shard", "0/1"},
            {"kvlab_version", "0.1.0"}};
}

// The cells of a markdown table, row by row (the header first, the rule left out).
std::vector<std::vector<std::string>> markdown_cells(const std::string & md) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(md);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("| ---", 0) == 0) continue;
        std::vector<std::string> cells;
        for (size_t i = 1; i < line.size();) {  // "| a | b |": cells between bars
            const size_t bar = line.find(" |", i);
            if (bar == std::string::npos) break;
            cells.push_back(line.substr(i + 1, bar - i - 1));
            i = bar + 2;
        }
        rows.push_back(cells);
    }
    return rows;
}

// The cells of the summary table of an HTML page (the <table> whose first cell is
// "method"): its <th> and <td> texts row by row, the table parsed as XML by tinyxml2,
// looking through the <tbody> that browsers insert.
std::vector<std::vector<std::string>> html_table_cells(const std::string & html) {
    for (size_t a = html.find("<table"); a != std::string::npos; a = html.find("<table", a + 1)) {
        const size_t b = html.find("</table>", a);
        if (b == std::string::npos) break;
        const std::string table = html.substr(a, b + 8 - a);
        tinyxml2::XMLDocument doc;
        EXPECT_EQ(doc.Parse(table.c_str(), table.size()), tinyxml2::XML_SUCCESS) << doc.ErrorStr() << "\n" << table;
        const tinyxml2::XMLElement * t = doc.RootElement();
        if (!t) continue;
        if (t->FirstChildElement("tbody")) t = t->FirstChildElement("tbody");
        std::vector<std::vector<std::string>> rows;
        for (const auto * tr = t->FirstChildElement("tr"); tr; tr = tr->NextSiblingElement("tr")) {
            rows.emplace_back();
            for (const auto * c = tr->FirstChildElement(); c; c = c->NextSiblingElement())
                rows.back().push_back(c->GetText() ? c->GetText() : "");
        }
        if (!rows.empty() && !rows[0].empty() && rows[0][0] == "method") return rows;
    }
    ADD_FAILURE() << "no summary table in the page";
    return {};
}

// The <svg> elements of an HTML page, as text.
std::vector<std::string> svg_fragments(const std::string & html) {
    std::vector<std::string> r;
    for (size_t a = html.find("<svg"); a != std::string::npos; a = html.find("<svg", a + 1)) {
        const size_t b = html.find("</svg>", a);
        if (b == std::string::npos) break;
        r.push_back(html.substr(a, b + 6 - a));
    }
    return r;
}

TEST(EvalReport, HtmlReport) {
    auto records = synthetic_records();
    records.push_back(answer("evil<&>", "ratio 0.5", 0.5, 1.0, 0.1, 1.0, true, 4 << 20, 0.4));
    const auto rows = eval::summarize(records);
    const std::string html = eval::html_report(rows, header_record());
    EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_NE(html.find("<meta charset=\"utf-8\">"), std::string::npos);
    EXPECT_NE(html.find("<title>"), std::string::npos);
    // the table holds the markdown table's cells, the method name escaped
    const auto cells = html_table_cells(html);
    EXPECT_EQ(cells, markdown_cells(eval::markdown_table(rows)));
    ASSERT_EQ(cells.size(), rows.size() + 1);
    EXPECT_NE(html.find("evil&lt;&amp;&gt;"), std::string::npos);
    EXPECT_EQ(html.find("evil<"), std::string::npos);
    // the three plots, each a well-formed SVG
    const auto svgs = svg_fragments(html);
    ASSERT_EQ(svgs.size(), 3u);
    parse_svg(svgs[0], 3, 5);  // score: knorm, snapkv, evil<&> (1 + 3 + 1 points)
    parse_svg(svgs[1], 3, 5);  // KL
    parse_svg(svgs[2], 0, 5);  // memory: the full cache is a square

    EXPECT_EQ(html.find("<b>"), std::string::npos);  // the config is escaped
    EXPECT_NE(html.find("abc123"), std::string::npos);
    EXPECT_NE(html.find("qwen3"), std::string::npos);
    EXPECT_NE(html.find("/models/tiny.gguf"), std::string::npos);
    EXPECT_FALSE(has_nonfinite(html));

    // a header without provenance (or no header at all) still makes a page
    for (const json & h : {json(nullptr), json::object(), json{{"provenance", "odd"}}}) {
        const std::string page = eval::html_report(rows, h);
        EXPECT_NE(page.find("</html>"), std::string::npos);
        EXPECT_EQ(svg_fragments(page).size(), 3u);
        EXPECT_EQ(html_table_cells(page), cells);
    }
}

// Chromium renders the page (a screenshot) and its DOM (--dump-dom, after parsing: tbody
// inserted, entities decoded) holds the markdown table's cells and the three plots.
TEST(EvalReport, HtmlRendersInChromium) {
    if (test::run_command("command -v chromium").exit_code != 0)
        GTEST_SKIP() << "chromium is not installed (the set-up script installs Debian's chromium)";
    const std::string dir = test::temp_dir("eval-html");
    const std::string page = dir + "/report.html", png = dir + "/report.png", dom = dir + "/dom.html";
    auto records = synthetic_records();
    records.push_back(answer("evil<&>", "ratio 0.5", 0.5, 1.0, 0.1, 1.0, true, 4 << 20, 0.4));
    const auto rows = eval::summarize(records);
    {
        std::ofstream out(page);
        out << eval::html_report(rows, header_record());
    }
    const auto r =
        test::run_command("(timeout 120 chromium --headless --no-sandbox --disable-gpu --dump-dom --screenshot=" + png +
                          " --window-size=1200,1600 file://" + page + " > " + dom + ")");
    ASSERT_TRUE(std::filesystem::exists(png)) << r.output;
    EXPECT_GT(std::filesystem::file_size(png), 10u * 1024u) << r.output;
    std::ifstream in(dom);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string rendered = ss.str();
    ASSERT_NE(rendered.find("<tbody>"), std::string::npos) << "not chromium's DOM:\n" << rendered << r.output;
    const auto cells = html_table_cells(rendered);
    EXPECT_EQ(cells, markdown_cells(eval::markdown_table(rows)));
    EXPECT_EQ(cells.size(), rows.size() + 1);
    const auto svgs = svg_fragments(rendered);
    ASSERT_EQ(svgs.size(), 3u);
    parse_svg(svgs[0], 3, 5);
    parse_svg(svgs[2], 0, 5);
    std::filesystem::remove_all(dir);
}

TEST(EvalReport, ReadRecordsRoundTrip) {
    const std::string dir = test::temp_dir("eval-records");
    const auto records = synthetic_records();
    const std::string a = dir + "/shard-0.jsonl", b = dir + "/shard-1.jsonl";
    {
        std::ofstream out(a);
        out << header_record().dump() << "\n\n";
        for (size_t i = 0; i < 3; ++i) out << records[i].dump() << "\n";
        std::ofstream out2(b);
        out2 << "   \n";
        for (size_t i = 3; i < records.size(); ++i) out2 << records[i].dump() << "\r\n";
    }
    const auto got = eval::read_records({a, b});
    ASSERT_EQ(got.size(), records.size() + 1);
    EXPECT_EQ(got[0], header_record());
    for (size_t i = 0; i < records.size(); ++i) EXPECT_EQ(got[i + 1], records[i]) << i;
    EXPECT_TRUE(eval::read_records({}).empty());
    std::filesystem::remove_all(dir);
}

TEST(EvalReport, ReadRecordsErrors) {
    const std::string dir = test::temp_dir("eval-records-bad");
    const std::string bad = dir + "/bad.jsonl";
    {
        std::ofstream out(bad);
        out << json{{"kind", "answer"}}.dump() << "\n\n{\"kind\": \"answer\", oops\n";
    }
    std::string msg = error_of([&] { eval::read_records({bad}); });
    EXPECT_NE(msg.find(bad + ":3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[eval]"), std::string::npos) << msg;

    const std::string array = dir + "/array.jsonl";
    {
        std::ofstream out(array);
        out << "[1, 2]\n";
    }
    msg = error_of([&] { eval::read_records({array}); });
    EXPECT_NE(msg.find(array + ":1"), std::string::npos) << msg;

    const std::string missing = dir + "/missing.jsonl";
    msg = error_of([&] { eval::read_records({missing}); });
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    msg = error_of([&] { eval::read_records({dir}); });
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
    std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvlab
