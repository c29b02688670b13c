// The summary of result records: means per (method, budget label), the best method at each
// budget and at each byte budget (report.h); the defensive record access (report_stats.h).
#include "eval/report_stats.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "eval/report.h"
#include "eval/report_format.h"

namespace kvlab::eval {
namespace {

using nlohmann::json;

}  // namespace

namespace report {

const json * field(const json & j, const char * key) {
    if (!j.is_object()) return nullptr;
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}

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

}  // namespace report

namespace {

using report::field;
using report::fmt;
using report::number;
using report::text;

struct Mean {
    double sum = 0.0;
    int64_t n = 0;
    void add(double v) {
        if (std::isfinite(v)) sum += v, ++n;
    }
    double get() const { return n > 0 ? sum / double(n) : 0.0; }
};

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

}  // namespace kvlab::eval
