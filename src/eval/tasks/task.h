// Internals of the task generators (one file per task family in src/eval/tasks/): the
// pieces they share (seeded randomness, word lists, filler text, needle placement, fitting
// a context to its target length) and the registry every family adds its tasks to. Adding
// a task = one file here that registers a TaskDef; nothing else changes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eval/tasks.h"
#include "kvlab/error.h"

namespace kvlab::eval::tasks {

// ---- deterministic randomness (libstdc++'s mt19937_64 is specified; distributions are not,
// so integers come from rng() % n and doubles from the top 53 bits)

// The generator of one sample: a hash of (seed, task, length, depth, index).
std::mt19937_64 sample_rng(uint64_t seed, const std::string & task, int64_t length, double depth, int index);

inline size_t pick(std::mt19937_64 & rng, size_t n) {
    return size_t(rng() % n);
}
inline double uniform01(std::mt19937_64 & rng) {
    return double(rng() >> 11) * 0x1.0p-53;
}

template <class T>
void shuffle(std::vector<T> & v, std::mt19937_64 & rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[pick(rng, i)]);
}

std::string digits(std::mt19937_64 & rng, int n);               // n decimal digits, the first not 0
std::string letters(std::mt19937_64 & rng, int n, char first);  // n letters from first to first + 25

// ---- words for keys (RULER: adjective-noun) and for common-words extraction (words.cpp)

struct Vocabulary {
    std::vector<std::string> adjectives, nouns, all;  // no word contains another as a substring
};
const Vocabulary & vocabulary();

// ---- filler text and needles (filler.cpp)

// RULER's noise sentences (passkey, vt).
extern const char * const kNoise;

std::vector<std::string> split_words(const std::string & text);
bool ends_sentence(const std::string & w);
// The essays' words, with the spaces they lost between sentences put back.
std::vector<std::string> essay_words(const std::string & text);

struct Filler {
    const std::vector<std::string> * words = nullptr;  // one cycle, repeated as needed
    size_t start = 0;                                  // first word
    bool sentence_cuts = false;                        // end after a whole sentence (noise), else after any word
};

struct Needles {
    std::string prefix;               // instructions before the filler
    std::string primary;              // at the requested depth of the whole context; empty: none
    double depth = 0.5;               // of the primary
    std::vector<std::string> others;  // at their fractions of the filler (in the order given)
    std::vector<double> fractions;
};

struct Built {
    std::string context;
    size_t primary_offset = 0;
    std::vector<size_t> other_offsets;
    nlohmann::json facts;  // what a builder derived (cwe and fwe: the answers)
};

// prefix + the first n_words of the filler with the needles placed in it.
Built build_needles(const Filler & filler, size_t n_words, const Needles & nd);

// ---- fitting a context to its target length

// What a generator gets: the sample's target, its generator and the prepared filler words.
struct Job {
    std::string task;
    int64_t length;
    double depth;  // < 0: the task has no depth
    const TokenCounter & count;
    const std::vector<std::string> & essay;  // the haystack's words (empty for tasks that don't use it)
    const std::vector<size_t> & essay_sentences;
    const std::vector<std::string> & noise;
    std::mt19937_64 rng;
    int64_t long_tokens = 0;  // TaskOptions::long_tokens
};

// The build with the largest n (from min_n) whose context has at most job.length tokens.
// make(n) must grow with n; its token count need not be exactly monotone.
template <class Make>
std::pair<Built, int64_t> fit(const Job & job, size_t min_n, const Make & make) {
    auto tokens = [&](const Built & b) { return job.count(b.context); };
    Built best = make(min_n);
    int64_t best_tokens = tokens(best);
    if (best_tokens > job.length)
        throw Error("eval",
                    job.task + ": length " + std::to_string(job.length) +
                        " is too small: the task's smallest context (instructions, needles, shortest list) takes " +
                        std::to_string(best_tokens) + " tokens");
    size_t lo = min_n, hi = std::max<size_t>(min_n + 1, size_t(job.length));
    for (;;) {  // grow hi until it overflows the target
        Built b = make(hi);
        const int64_t t = tokens(b);
        if (t > job.length) break;
        lo = hi, best = std::move(b), best_tokens = t;
        if (hi > (size_t(1) << 40)) return {best, best_tokens};
        hi *= 2;
    }
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        Built b = make(mid);
        const int64_t t = tokens(b);
        if (t <= job.length)
            lo = mid, best = std::move(b), best_tokens = t;
        else
            hi = mid;
    }
    return {best, best_tokens};
}

// The essays from a random sentence start of the haystack.
Filler essay_filler(Job & job);
// The fitted needle context; meta: context_tokens, needle_offset, needle_depth (of the
// primary, else of the first other), other_offsets.
Sample needle_sample(Job & job, const Filler & filler, const Needles & nd);

// The fitted context of a word-extraction task (ruler_cwe, ruler_fwe), make(n) building it from
// n words (n from min_n); meta: the builder's facts and context_tokens; one question, whose
// answers facts[answer] must all appear (string_match_all).
template <class Make>
Sample extraction_sample(const Job & job, size_t min_n, const Make & make, const std::string & question,
                         const std::string & answer) {
    auto [b, n_tokens] = fit(job, min_n, make);
    Sample s;
    s.context = std::move(b.context);
    s.meta = b.facts;
    s.meta["context_tokens"] = n_tokens;
    s.metric = "string_match_all";
    s.questions = {{question, b.facts[answer]}};
    return s;
}

// ---- the registry (registry.cpp)

struct TaskDef {
    const char * name;
    const char * description;
    Sample (*gen)(Job &);
    bool has_depth;    // generated at each of TaskOptions::depths (else once, depth -1)
    bool uses_essays;  // fills with the haystack (else with its own text)
    int list_order;    // position in task_names(): niah 10, passkey 20, ruler_niah_* 30-33, ruler_vt 40,
                       // ruler_cwe 50, ruler_fwe 60, many_facts 35, long_continuation 80; a new task takes
                       // a free number
};

void register_task(const TaskDef & def);

// Registers a family's tasks at static-initialisation time: `const TaskRegistrar reg({{...}});`
struct TaskRegistrar {
    TaskRegistrar(std::initializer_list<TaskDef> defs) {
        for (const TaskDef & d : defs) register_task(d);
    }
};

}  // namespace kvlab::eval::tasks
