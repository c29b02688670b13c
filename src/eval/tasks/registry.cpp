// The task registry and make_task: every family registers its TaskDefs (one file each in
// src/eval/tasks/); make_task checks the options, prepares the filler words once and gives
// each sample its own generator, id and the common meta fields.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "eval/tasks/task.h"

namespace kvlab::eval {
namespace tasks {

namespace {

constexpr int64_t kMinTokens = 64;  // shorter contexts cannot hold the needles and some filler

// Sorted by list_order (static initialisation runs the families' files in no fixed order).
std::vector<TaskDef> & registry() {
    static std::vector<TaskDef> r;
    return r;
}

const TaskDef * find_task(const std::string & name) {
    for (const TaskDef & t : registry())
        if (name == t.name) return &t;
    return nullptr;
}

std::string depth_label(double d) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f", d);
    if (std::fabs(std::strtod(buf, nullptr) - d) > 1e-12) std::snprintf(buf, sizeof buf, "%.6g", d);
    return buf;
}

std::string known_tasks() {
    std::string s;
    for (const auto & t : registry()) s += (s.empty() ? "" : ", ") + std::string(t.name);
    return s;
}

}  // namespace

void register_task(const TaskDef & def) {
    KVLAB_ASSERT(!find_task(def.name), "task registered twice");
    auto & r = registry();
    r.insert(std::upper_bound(r.begin(), r.end(), def,
                              [](const TaskDef & a, const TaskDef & b) { return a.list_order < b.list_order; }),
             def);
}

}  // namespace tasks

using namespace tasks;

Haystack load_haystack(const std::vector<std::string> & files) {
    Haystack h;
    for (const auto & f : files) {
        std::ifstream in(f, std::ios::binary);
        if (!in || !std::filesystem::is_regular_file(f)) throw Error("eval", "cannot read haystack file " + f);
        std::stringstream ss;
        ss << in.rdbuf();
        if (!h.text.empty()) h.text += "\n\n";
        h.text += ss.str();
        h.source += (h.source.empty() ? "" : ", ") + f;
    }
    return h;
}

std::vector<std::pair<std::string, std::string>> task_names() {
    std::vector<std::pair<std::string, std::string>> r;
    for (const auto & t : registry()) r.emplace_back(t.name, t.description);
    return r;
}

std::vector<Sample> make_task(const std::string & name, const TaskOptions & opts, const Haystack & hay,
                              const TokenCounter & count_tokens) {
    const TaskDef * def = find_task(name);
    if (!def) throw Error("eval", "unknown task '" + name + "' (known: " + known_tasks() + ")");
    if (!count_tokens) throw Error("eval", name + ": no token counter");
    if (opts.lengths.empty()) throw Error("eval", name + ": no context lengths");
    if (opts.n_samples < 1) throw Error("eval", name + ": n_samples must be at least 1");
    if (opts.long_tokens < 1) throw Error("eval", name + ": long_tokens must be at least 1");
    for (int64_t l : opts.lengths)
        if (l < kMinTokens)
            throw Error("eval", name + ": length " + std::to_string(l) + " is too small (at least " +
                                    std::to_string(kMinTokens) + " tokens)");
    std::vector<double> depths = {-1.0};
    if (def->has_depth) {
        if (opts.depths.empty()) throw Error("eval", name + ": no depths");
        for (double d : opts.depths)
            if (!(d >= 0.0 && d <= 1.0))
                throw Error("eval", name + ": depth " + std::to_string(d) + " is not in [0, 1]");
        depths = opts.depths;
    }

    std::vector<std::string> essay;
    std::vector<size_t> essay_sentences;
    if (def->uses_essays) {
        essay = essay_words(hay.text);
        for (size_t i = 0; i < essay.size(); ++i)
            if (i == 0 || ends_sentence(essay[i - 1])) essay_sentences.push_back(i);
    }
    const std::vector<std::string> noise = split_words(kNoise);

    std::vector<Sample> out;
    for (int64_t length : opts.lengths)
        for (double depth : depths)
            for (int i = 0; i < opts.n_samples; ++i) {
                Job job{name,
                        length,
                        depth,
                        count_tokens,
                        essay,
                        essay_sentences,
                        noise,
                        sample_rng(opts.seed, name, length, depth, i),
                        opts.long_tokens};
                Sample s = def->gen(job);
                s.task = name;
                s.id = name + "/L" + std::to_string(length) + (depth < 0 ? "" : "/d" + depth_label(depth)) + "/s" +
                       std::to_string(opts.seed) + "/i" + std::to_string(i);
                s.meta["target_tokens"] = length;
                s.meta["depth"] = depth;
                s.meta["seed"] = opts.seed;
                s.meta["index"] = i;
                if (!s.meta.contains("needle_offset")) {  // cwe, fwe: no needle
                    s.meta["needle_offset"] = -1;
                    s.meta["needle_depth"] = -1.0;
                }
                if (def->uses_essays) s.meta["haystack"] = hay.source;
                out.push_back(std::move(s));
            }
    return out;
}

}  // namespace kvlab::eval
