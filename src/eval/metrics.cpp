// Task scores (RULER string match; SQuAD v1.1 exact match and token F1) and the fidelity
// of a compressed cache's logits to the full cache's (KL divergence, top-1 agreement).
//
// Text is handled as bytes: lower-casing and punctuation are ASCII (as SQuAD's
// string.punctuation is); bytes >= 0x80 count as word characters, so UTF-8 letters stay
// inside words, as Python's Unicode \w keeps them.
#include "eval/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "kvlab/error.h"

namespace kvlab::eval {
namespace {

std::string lower_ascii(const std::string & s) {
    std::string r = s;
    for (char & c : r)
        if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return r;
}

// Python's str.split() whitespace within ASCII: \t \n \v \f \r, 0x1c..0x1f and space.
bool is_space(unsigned char c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f);
}

// Python's string.punctuation.
bool is_punct(unsigned char c) {
    return c < 0x80 && std::ispunct(c);
}

// \w of a Python str regex: letters, digits, underscore (and, here, every non-ASCII byte).
bool is_word(unsigned char c) {
    return c >= 0x80 || std::isalnum(c) || c == '_';
}

std::vector<std::string> split_ws(const std::string & s) {
    std::vector<std::string> out;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_space((unsigned char)s[i])) ++i;
        size_t j = i;
        while (j < s.size() && !is_space((unsigned char)s[j])) ++j;
        if (j > i) out.push_back(s.substr(i, j - i));
        i = j;
    }
    return out;
}

// re.sub(r'\b(a|an|the)\b', ' ', text)
std::string remove_articles(const std::string & s) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size()) {
        const bool at_boundary = i == 0 || !is_word((unsigned char)s[i - 1]);
        if (at_boundary) {
            size_t len = 0;
            for (const char * art : {"the", "an", "a"}) {
                const size_t n = std::char_traits<char>::length(art);
                if (s.compare(i, n, art) == 0 && (i + n == s.size() || !is_word((unsigned char)s[i + n]))) {
                    len = n;
                    break;
                }
            }
            if (len > 0) {
                out += ' ';
                i += len;
                continue;
            }
        }
        out += s[i++];
    }
    return out;
}

std::vector<std::string> normalized_tokens(const std::string & s) {
    return split_ws(normalize_answer(s));
}

double f1_one(const std::vector<std::string> & pred, const std::vector<std::string> & ref) {
    std::map<std::string, int64_t> counts;
    for (const auto & t : ref) ++counts[t];
    int64_t same = 0;
    for (const auto & t : pred) {
        auto it = counts.find(t);
        if (it != counts.end() && it->second > 0) {
            --it->second;
            ++same;
        }
    }
    if (same == 0) return 0.0;  // SQuAD v1.1: also when either side is empty
    const double precision = double(same) / double(pred.size());
    const double recall = double(same) / double(ref.size());
    return 2.0 * precision * recall / (precision + recall);
}

// log-softmax of one row, in double.
void log_softmax(const float * x, int64_t n, std::vector<double> & out) {
    out.resize(size_t(n));
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
    const double lse = mx + std::log(sum);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
}

int64_t argmax(const float * x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;  // ties: the lowest index
    return best;
}

}  // namespace

double string_match_all(const std::string & prediction, const std::vector<std::string> & refs) {
    if (refs.empty()) return 0.0;
    const std::string p = lower_ascii(prediction);
    int64_t hits = 0;
    for (const auto & r : refs) hits += p.find(lower_ascii(r)) != std::string::npos;
    return double(hits) / double(refs.size());
}

double string_match_part(const std::string & prediction, const std::vector<std::string> & refs) {
    const std::string p = lower_ascii(prediction);
    for (const auto & r : refs)
        if (p.find(lower_ascii(r)) != std::string::npos) return 1.0;
    return 0.0;
}

std::string normalize_answer(const std::string & s) {
    std::string t;
    t.reserve(s.size());
    for (char c : lower_ascii(s))
        if (!is_punct((unsigned char)c)) t += c;
    std::string out;
    for (const auto & w : split_ws(remove_articles(t))) {
        if (!out.empty()) out += ' ';
        out += w;
    }
    return out;
}

double exact_match(const std::string & prediction, const std::vector<std::string> & refs) {
    const std::string p = normalize_answer(prediction);
    for (const auto & r : refs)
        if (normalize_answer(r) == p) return 1.0;
    return 0.0;
}

double token_f1(const std::string & prediction, const std::vector<std::string> & refs) {
    const auto p = normalized_tokens(prediction);
    double best = 0.0;
    for (const auto & r : refs) best = std::max(best, f1_one(p, normalized_tokens(r)));
    return best;
}

double score(const std::string & metric, const std::string & prediction, const std::vector<std::string> & refs) {
    if (metric == "string_match_all") return string_match_all(prediction, refs);
    if (metric == "string_match_part") return string_match_part(prediction, refs);
    if (metric == "exact_match") return exact_match(prediction, refs);
    if (metric == "f1") return token_f1(prediction, refs);
    throw Error("eval",
                "unknown metric '" + metric + "' (known: string_match_all, string_match_part, exact_match, f1)");
}

double kl_divergence(const float * logits_p, const float * logits_q, int64_t n_vocab) {
    KVLAB_ASSERT(n_vocab > 0, "kl_divergence needs n_vocab > 0");
    std::vector<double> lp, lq;
    log_softmax(logits_p, n_vocab, lp);
    log_softmax(logits_q, n_vocab, lq);
    double kl = 0.0;
    for (size_t i = 0; i < lp.size(); ++i) {
        const double p = std::exp(lp[i]);
        if (p > 0.0) kl += p * (lp[i] - lq[i]);  // 0 log 0 = 0
    }
    return std::max(kl, 0.0);  // >= 0 in exact arithmetic; rounding may dip below
}

Fidelity fidelity(const std::vector<float> & full, const std::vector<float> & compressed, int64_t n_vocab) {
    if (n_vocab <= 0) throw Error("eval", "fidelity: n_vocab must be positive, got " + std::to_string(n_vocab));
    if (full.size() != compressed.size())
        throw Error("eval", "fidelity: logit sizes differ (" + std::to_string(full.size()) + " vs " +
                                std::to_string(compressed.size()) + ")");
    if (full.size() % size_t(n_vocab) != 0)
        throw Error("eval", "fidelity: " + std::to_string(full.size()) + " logits are not rows of n_vocab " +
                                std::to_string(n_vocab));
    Fidelity f;
    f.n_positions = int64_t(full.size()) / n_vocab;
    if (f.n_positions == 0) return f;
    int64_t agree = 0;
    double sum = 0.0;
    for (int64_t r = 0; r < f.n_positions; ++r) {
        const float * p = full.data() + r * n_vocab;
        const float * q = compressed.data() + r * n_vocab;
        const double kl = kl_divergence(p, q, n_vocab);
        sum += kl;
        f.kl_max = std::max(f.kl_max, kl);
        agree += argmax(p, n_vocab) == argmax(q, n_vocab);
    }
    f.kl_mean = sum / double(f.n_positions);
    f.top1_agreement = double(agree) / double(f.n_positions);
    return f;
}

}  // namespace kvlab::eval
