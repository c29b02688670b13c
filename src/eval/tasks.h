// Evaluation tasks (issue: evaluation harness): deterministic generators of long contexts
// with questions whose answers are planted in the context, and a loader for QA datasets.
// A generator never needs a model: it measures length with the given token counter.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvlab::eval {

struct Question {
    std::string question;
    std::vector<std::string> answers;  // any (or all, per the metric) must appear in the prediction
};

struct Sample {
    std::string id;      // stable and unique: task, length, depth, index, seed
    std::string task;    // "niah", "passkey", "ruler_niah_single", ..., or a dataset name
    std::string metric;  // "string_match_all" | "string_match_part" | "exact_match" | "f1" | "fidelity"
    std::string context;
    std::vector<Question> questions;
    nlohmann::json meta;  // task facts: target tokens, depth, needles, ...
    // Long generation: every answer takes exactly this many tokens (EOG does not stop it), so
    // that each method is measured along the same length; 0: the run's max_tokens.
    int64_t answer_tokens = 0;
};

// Counts the tokens of a text (the model's tokenizer in kvlab; a word counter in tests).
using TokenCounter = std::function<int64_t(const std::string &)>;

struct TaskOptions {
    std::vector<int64_t> lengths = {1024};  // target context lengths in tokens (contexts stay at or below)
    std::vector<double> depths = {0.5};     // needle depth in [0, 1] (fraction of the context before it)
    int n_samples = 1;                      // per (length, depth)
    uint64_t seed = 0;
    int64_t long_tokens = 1024;  // the answer length of the long-generation tasks (long_continuation)
};

// The haystack: text to fill contexts with (the essays of ../shared/data or tests/data).
struct Haystack {
    std::string text;
    std::string source;  // where it came from, for the records
};
Haystack load_haystack(const std::vector<std::string> & files);

// Task names accepted by make_task, with one line of description each.
std::vector<std::pair<std::string, std::string>> task_names();

// Generates the samples of a task. Throws kvlab::Error for an unknown task name. Each task
// family is one file in src/eval/tasks/ that registers its tasks (eval/tasks/task.h).
//  niah               : a needle sentence at each depth of an essay haystack; string_match_all
//  passkey            : a 5-digit pass key in repeated filler text; string_match_all
//  ruler_niah_single  : one "special magic number" key-value needle in the essays
//  ruler_niah_multikey: one needle among 3 distractor keys
//  ruler_niah_multivalue: one key with 4 values, all asked for
//  ruler_niah_multiquery: 4 keys asked at once, all values asked for
//  ruler_vt           : variable tracking: chains VAR X = N, VAR Y = VAR X ..., names of all
//                       variables holding N; string_match_all
//  ruler_cwe          : common-words extraction: the 10 most common words of a word list
//  ruler_fwe          : frequent-words extraction: the 3 most frequent coded words
//  long_continuation  : continue an essay excerpt for long_tokens tokens; metric fidelity (the
//                       top-1 agreement with the full cache along its own continuation)
std::vector<Sample> make_task(const std::string & name, const TaskOptions & opts, const Haystack & hay,
                              const TokenCounter & count_tokens);

// Loads a QA dataset in JSONL: one object per line, {context, questions: [{question,
// answers}]} or LongBench's {context, input, answers, _id / dataset}. metric: f1 unless the
// line says otherwise ("metric"). Throws kvlab::Error naming the file and line.
std::vector<Sample> load_qa_jsonl(const std::string & path, const std::string & metric = "f1");

}  // namespace kvlab::eval
