// Reports from result records (JSONL, one object per answer; see runner.h): a markdown
// summary per method x budget, SVG plots, and an HTML page that shows them.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvlab::eval {

// One row per (method, budget label), the full cache ("none") first, then by method and
// compression ratio: mean score, mean KL, top-1 agreement, identical answers, mean KV
// allocated bytes, mean TTFT, decode tokens/s, compression time, and the count.
struct SummaryRow {
    std::string method, budget;  // budget label: "full", "ratio 0.5", "budget 256"
    double ratio = 0.0;          // mean achieved compression (1 - kept / context rows)
    int64_t n = 0;
    double score = 0.0, kl = 0.0, top1 = 0.0, identical = 0.0;
    double kv_bytes = 0.0, ttft_s = 0.0, decode_tps = 0.0, compress_s = 0.0;
    double kv_peak = NAN;  // mean bytes of the answers' caches at their largest (NaN: older records)
    // the score of each sample's first question, and of its later ones (NaN when none):
    // several questions answered from one compressed cache
    double score_first = 0.0, score_later = 0.0;
    int64_t n_later = 0;
    // memory in bytes: the precision policy (a curve: "f16 evict", "f16 demote q4_0", "q8_0
    // full"), the mean K/V bytes held as a share of the context's full cache at F16, and the
    // byte budget asked for in that unit (NaN for row budgets and records without them)
    std::string policy;
    double bytes_ratio = NAN, budget_bytes_ratio = NAN;
};
std::vector<SummaryRow> summarize(const std::vector<nlohmann::json> & answer_records);
std::string markdown_table(const std::vector<SummaryRow> & rows);
// One line per budget: the method with the best mean score there (ties: the lower KL).
std::string best_per_ratio(const std::vector<SummaryRow> & rows);
// One line per byte budget asked for: among every configuration whose K/V bytes fit in it (any
// method, policy or cache type, the full caches included), the best mean score (ties: the lower
// KL), and beside it the best of each family: F16 rows evicted, quantized rows evicted, rows
// demoted; "" without byte budgets.
std::string best_per_bytes(const std::vector<SummaryRow> & rows);

// SVG line plots: score against compression ratio (one line per method), KL against ratio,
// and a scatter of KV allocated bytes against TTFT.
std::string svg_score_vs_ratio(const std::vector<SummaryRow> & rows);
std::string svg_kl_vs_ratio(const std::vector<SummaryRow> & rows);
std::string svg_memory_vs_ttft(const std::vector<SummaryRow> & rows);
// Score and KL against K/V bytes (share of the full cache at F16): one line per method x
// precision policy, the full caches of every cache type as points.
std::string svg_score_vs_bytes(const std::vector<SummaryRow> & rows);
std::string svg_kl_vs_bytes(const std::vector<SummaryRow> & rows);

// A self-contained HTML page: title, the run's configuration and provenance (header
// record), the table and the three plots inline.
std::string html_report(const std::vector<SummaryRow> & rows, const nlohmann::json & header);

// Reads every record of the given JSONL files (shards), in order; lines that are not JSON
// objects throw kvlab::Error naming file and line.
std::vector<nlohmann::json> read_records(const std::vector<std::string> & files);

}  // namespace kvlab::eval
