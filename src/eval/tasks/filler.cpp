// Filler text (the essays or RULER's noise sentences) and the placement of needles in it:
// the primary needle at the requested depth of the whole context, the others at their
// fractions of the filler, always at a sentence boundary when one lies near enough.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <sstream>

#include "eval/tasks/task.h"

namespace kvlab::eval::tasks {

const char * const kNoise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

std::vector<std::string> split_words(const std::string & text) {
    std::vector<std::string> words;
    std::istringstream in(text);
    for (std::string w; in >> w;) words.push_back(w);
    return words;
}

bool ends_sentence(const std::string & w) {
    size_t n = w.size();
    while (n > 0 && std::strchr("\"')]", w[n - 1])) --n;
    return n > 0 && std::strchr(".?!", w[n - 1]);
}

// The essays lost some line breaks ("broken.The"): a space goes back between a lower-case
// letter's sentence end and the next capital.
std::vector<std::string> essay_words(const std::string & text) {
    std::string t;
    t.reserve(text.size() + text.size() / 64);
    for (size_t i = 0; i < text.size(); ++i) {
        t += text[i];
        if (i > 0 && i + 1 < text.size() && std::strchr(".?!", text[i]) && std::islower((unsigned char)text[i - 1]) &&
            std::isupper((unsigned char)text[i + 1]))
            t += ' ';
    }
    return split_words(t);
}

namespace {

struct FillerText {
    std::string text;
    std::vector<size_t> sentence_starts;  // character offsets where a sentence starts (0 included)
    std::vector<size_t> word_starts;
};

// The first n words of the filler, one space apart (fewer: cut back to a sentence end).
FillerText filler_text(const Filler & f, size_t n) {
    FillerText r;
    size_t cut_len = 0, cut_sentences = 0, cut_words = 0;
    bool prev_end = true;
    const auto & w = *f.words;
    for (size_t i = 0; i < n; ++i) {
        const std::string & word = w[(f.start + i) % w.size()];
        if (!r.text.empty()) r.text += ' ';
        if (prev_end) r.sentence_starts.push_back(r.text.size());
        r.word_starts.push_back(r.text.size());
        r.text += word;
        prev_end = ends_sentence(word);
        if (prev_end)
            cut_len = r.text.size(), cut_sentences = r.sentence_starts.size(), cut_words = r.word_starts.size();
    }
    if (f.sentence_cuts) {
        r.text.resize(cut_len);
        r.sentence_starts.resize(cut_sentences);
        r.word_starts.resize(cut_words);
    }
    if (r.sentence_starts.empty()) r.sentence_starts.push_back(0);
    return r;
}

struct Insert {
    size_t pos;  // a word start of the filler, or its end
    std::string text;
    double rank = 0;  // orders the inserts at one position
};

// The filler with the inserts at their positions, one space between pieces; offsets[i]: where
// inserts[i] starts in the result (inserts at one position keep their order).
std::string assemble(const std::string & filler, const std::vector<Insert> & ins, std::vector<size_t> & offsets) {
    std::vector<size_t> order(ins.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return ins[a].pos != ins[b].pos ? ins[a].pos < ins[b].pos : ins[a].rank < ins[b].rank;
    });
    std::string out;
    size_t extra = 0;
    for (const auto & i : ins) extra += i.text.size() + 1;
    out.reserve(filler.size() + extra);
    offsets.assign(ins.size(), 0);
    size_t cur = 0;
    for (size_t k : order) {
        const Insert & in = ins[k];
        KVLAB_ASSERT(in.pos >= cur && in.pos <= filler.size(), "insert outside the filler");
        out.append(filler, cur, in.pos - cur);
        cur = in.pos;
        if (!out.empty() && out.back() != ' ') out += ' ';
        offsets[k] = out.size();
        out += in.text;
        if (in.pos < filler.size()) out += ' ';
    }
    out.append(filler, cur, std::string::npos);
    return out;
}

// The candidate position (a sentence start, or the end) whose offset_of is nearest target;
// a word start instead when no sentence boundary lies within tol.
template <class OffsetOf>
size_t place(const FillerText & f, double target, double tol, const OffsetOf & offset_of) {
    auto best_of = [&](const std::vector<size_t> & cands, size_t & best, double & miss) {
        best = f.text.size();
        miss = std::fabs(double(offset_of(best)) - target);
        for (size_t c : cands) {
            const double m = std::fabs(double(offset_of(c)) - target);
            if (m < miss) best = c, miss = m;
        }
    };
    size_t best;
    double miss;
    best_of(f.sentence_starts, best, miss);
    if (miss > tol) best_of(f.word_starts, best, miss);
    return best;
}

constexpr double kDepthTolerance = 0.05;  // a sentence boundary this near (fraction of the context) wins

}  // namespace

Built build_needles(const Filler & filler, size_t n_words, const Needles & nd) {
    const FillerText f = filler_text(filler, n_words);
    std::vector<size_t> pos;  // the others need no precision: always at a sentence boundary
    for (double fr : nd.fractions)
        pos.push_back(place(f, fr * double(f.text.size()), HUGE_VAL, [](size_t p) { return p; }));
    std::sort(pos.begin(), pos.end());  // keeps the others in order (vt's chain)
    std::vector<Insert> ins;
    size_t others_len = 0;
    for (size_t i = 0; i < nd.others.size(); ++i) {
        ins.push_back({pos[i], nd.others[i], double(i)});
        others_len += nd.others[i].size() + 1;
    }
    if (!nd.primary.empty()) {
        const size_t F = f.text.size();
        const double total = double(nd.prefix.size() + F + others_len + nd.primary.size() + 1);
        const double target = nd.depth * total;
        // where the primary lands at position p after the first m others there, for the best m
        auto at = [&](size_t p) {
            size_t before = 0, best_off = 0, best_m = 0;
            std::vector<size_t> tied;  // lengths of the others at p, in order
            for (const auto & in : ins) {
                if (in.pos < p) before += in.text.size() + 1;
                if (in.pos == p) tied.push_back(in.text.size() + 1);
            }
            for (size_t m = 0; m <= tied.size(); ++m) {
                if (m > 0) before += tied[m - 1];
                const size_t off = nd.prefix.size() + p + before + (p == F && (F > 0 || before > 0) ? 1 : 0);
                if (m == 0 || std::fabs(double(off) - target) < std::fabs(double(best_off) - target))
                    best_off = off, best_m = m;
            }
            return std::pair<size_t, size_t>(best_off, best_m);
        };
        const size_t p = place(f, target, kDepthTolerance * total, [&](size_t q) { return at(q).first; });
        size_t first_tied = 0;
        while (first_tied < pos.size() && pos[first_tied] < p) ++first_tied;
        ins.push_back({p, nd.primary, double(first_tied + at(p).second) - 0.5});
    }
    std::vector<size_t> offsets;
    Built b;
    b.context = nd.prefix + assemble(f.text, ins, offsets);
    for (size_t & o : offsets) o += nd.prefix.size();
    if (!nd.primary.empty()) b.primary_offset = offsets.back(), offsets.pop_back();
    b.other_offsets = offsets;
    return b;
}

Filler essay_filler(Job & job) {
    if (job.essay.empty()) throw Error("eval", job.task + ": the haystack is empty");
    return {&job.essay, job.essay_sentences[pick(job.rng, job.essay_sentences.size())], false};
}

Sample needle_sample(Job & job, const Filler & filler, const Needles & nd) {
    auto [b, n_tokens] = fit(job, 0, [&](size_t n) { return build_needles(filler, n, nd); });
    Sample s;
    s.context = std::move(b.context);
    const size_t off = nd.primary.empty() ? b.other_offsets.at(0) : b.primary_offset;
    s.meta = {{"context_tokens", n_tokens},
              {"needle_offset", off},
              {"needle_depth", s.context.empty() ? 0.0 : double(off) / double(s.context.size())}};
    s.meta["other_offsets"] = b.other_offsets;
    return s;
}

}  // namespace kvlab::eval::tasks
