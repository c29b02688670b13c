// Evaluation tasks (eval/tasks.h): every generator is deterministic for a seed, fits its
// target length (a word counter stands in for the tokenizer), and plants its answers in the
// context, at the requested depth where the task has one; the answers of cwe, fwe and vt are
// recomputed here from the context itself. The QA loader reads both JSONL formats and names
// file and line in its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "eval/tasks.h"
#include "kvlab/error.h"
#include "support/fixtures.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using eval::Sample;
using eval::TaskOptions;

int64_t count_words(const std::string & s) {
    std::istringstream in(s);
    int64_t n = 0;
    for (std::string w; in >> w;) ++n;
    return n;
}

std::string lower(std::string s) {
    for (char & c : s) c = char(std::tolower((unsigned char)c));
    return s;
}

const eval::Haystack & haystack() {
    static const eval::Haystack h = [] {
        std::vector<std::string> files;
        for (const auto & e : fs::directory_iterator(test::source_dir() + "/data/haystack"))
            if (e.path().extension() == ".txt") files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
        return eval::load_haystack(files);
    }();
    return h;
}

std::vector<std::string> all_tasks() {
    std::vector<std::string> r;
    for (const auto & [name, desc] : eval::task_names()) r.push_back(name);
    return r;
}

bool is_niah(const std::string & t) {
    return t == "niah" || t.rfind("ruler_niah_", 0) == 0;
}

std::vector<Sample> make(const std::string & task, std::vector<int64_t> lengths, std::vector<double> depths,
                         int n_samples = 1, uint64_t seed = 0) {
    TaskOptions o;
    o.lengths = std::move(lengths);
    o.depths = std::move(depths);
    o.n_samples = n_samples;
    o.seed = seed;
    return eval::make_task(task, o, haystack(), count_words);
}

// Words that follow "<n>. " on the lines of cwe's list, and fwe's coded words, with counts.
std::map<std::string, int> cwe_counts(const std::string & ctx) {
    std::map<std::string, int> c;
    const std::regex line("^[0-9]+\\. ([a-z]+)$");
    std::istringstream in(ctx);
    std::smatch m;
    for (std::string l; std::getline(in, l);)
        if (std::regex_match(l, m, line)) ++c[m[1]];
    return c;
}

std::map<std::string, int> fwe_counts(const std::string & ctx) {
    std::map<std::string, int> c;
    std::istringstream in(ctx.substr(ctx.find("\n\n") + 2));
    for (std::string w; in >> w;) ++c[w];
    return c;
}

// The k most frequent words, checking that the k-th is strictly above the (k+1)-th.
std::set<std::string> top_k(const std::map<std::string, int> & counts, size_t k) {
    std::vector<std::pair<int, std::string>> v;
    for (const auto & [w, n] : counts) v.push_back({n, w});
    std::sort(v.rbegin(), v.rend());
    EXPECT_GT(v.size(), k);
    if (v.size() > k) {
        EXPECT_GT(v[k - 1].first, v[k].first);
    }
    std::set<std::string> r;
    for (size_t i = 0; i < k && i < v.size(); ++i) r.insert(v[i].second);
    return r;
}

std::set<std::string> as_set(const std::vector<std::string> & v) {
    return {v.begin(), v.end()};
}

// Every test of the suite shares the fixture; the QA tests write their files in dir().
class EvalTasks : public ::testing::Test {
protected:
    void TearDown() override {
        if (!dir_.empty()) fs::remove_all(dir_);
    }
    const std::string & dir() {
        if (dir_.empty()) dir_ = test::temp_dir("tasks");
        return dir_;
    }
    std::string write(const std::string & name, const std::string & text) {
        const std::string p = dir() + "/" + name;
        std::ofstream(p, std::ios::binary) << text;
        return p;
    }

private:
    std::string dir_;
};

TEST_F(EvalTasks, NamesAndDescriptions) {
    const auto names = eval::task_names();
    const std::set<std::string> expected = {"niah",
                                            "many_facts",
                                            "passkey",
                                            "ruler_niah_single",
                                            "ruler_niah_multikey",
                                            "ruler_niah_multivalue",
                                            "ruler_niah_multiquery",
                                            "ruler_vt",
                                            "ruler_cwe",
                                            "ruler_fwe",
                                            "long_continuation"};
    std::set<std::string> got;
    for (const auto & [name, desc] : names) {
        got.insert(name);
        EXPECT_FALSE(desc.empty()) << name;
    }
    EXPECT_EQ(got, expected);
    EXPECT_EQ(names.size(), expected.size());
}

TEST_F(EvalTasks, Deterministic) {
    for (const auto & t : all_tasks()) {
        const auto a = make(t, {256}, {0.5}, 2, 7), b = make(t, {256}, {0.5}, 2, 7), c = make(t, {256}, {0.5}, 2, 8);
        ASSERT_EQ(a.size(), 2u) << t;
        ASSERT_EQ(b.size(), a.size());
        ASSERT_EQ(c.size(), a.size());
        for (size_t i = 0; i < a.size(); ++i) {
            EXPECT_EQ(a[i].id, b[i].id);
            EXPECT_EQ(a[i].context, b[i].context) << t;
            EXPECT_EQ(a[i].meta.dump(), b[i].meta.dump()) << t;
            ASSERT_EQ(a[i].questions.size(), b[i].questions.size());
            for (size_t q = 0; q < a[i].questions.size(); ++q) {
                EXPECT_EQ(a[i].questions[q].question, b[i].questions[q].question);
                EXPECT_EQ(a[i].questions[q].answers, b[i].questions[q].answers);
            }
            EXPECT_NE(a[i].context, c[i].context) << t << ": seed 8 gave seed 7's context";
            EXPECT_NE(a[i].id, c[i].id);
        }
        EXPECT_NE(a[0].context, a[1].context) << t << ": two samples alike";
    }
}

// Every generator is frozen: the samples of a fixed configuration hash to the digests below
// (FNV-1a 64 of id, metric, context, questions and meta less the haystack's file paths),
// which the generators had before
// tasks.cpp was split into src/eval/tasks/. A change to any sample of any task shows here,
// and it changes the records of every evaluation: update the digest and say why.
uint64_t fnv1a(uint64_t h, const std::string & s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull;  // a separator, so that ("ab", "c") != ("a", "bc")
}

TEST_F(EvalTasks, SamplesAreFrozen) {
    const std::map<std::string, uint64_t> want = {
        {"long_continuation", 0xe6e3a3228bb8951bull},
        {"many_facts", 0xa9adfb6b315ba916ull},
        {"niah", 0xd0e444e15e826ba8ull},
        {"passkey", 0x18db3b031391e4f5ull},
        {"ruler_cwe", 0xf46dfdda5c40dc82ull},
        {"ruler_fwe", 0x53c58bceb4172544ull},
        {"ruler_niah_multikey", 0xd01ed5fa44fade16ull},
        {"ruler_niah_multiquery", 0xacf1b10b0fad3c82ull},
        {"ruler_niah_multivalue", 0x332d5d2d3aaccbb7ull},
        {"ruler_niah_single", 0xf7b5550bd864f934ull},
        {"ruler_vt", 0x49aa66fc862d2379ull},
    };
    std::map<std::string, uint64_t> got;
    for (const auto & t : all_tasks()) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const auto & s : make(t, {300, 1000}, {0.2, 0.7}, 2, 5)) {
            for (const std::string * f : {&s.id, &s.task, &s.metric, &s.context}) h = fnv1a(h, *f);
            for (const auto & q : s.questions) {
                h = fnv1a(h, q.question);
                for (const auto & a : q.answers) h = fnv1a(h, a);
            }
            nlohmann::json meta = s.meta;
            meta.erase("haystack");  // the essays' paths: they depend on where the checkout is
            h = fnv1a(h, meta.dump());
        }
        got[t] = h;
    }
    std::string table;
    for (const auto & [t, h] : got) {
        char hex[24];
        std::snprintf(hex, sizeof hex, "0x%016llxull", static_cast<unsigned long long>(h));
        table += "{\"" + t + "\", " + hex + "},\n";
    }
    EXPECT_EQ(got, want) << "the digests now:\n" << table;
}

TEST_F(EvalTasks, AnswersInContextAndLengthFits) {
    for (const auto & t : all_tasks())
        if (t != "long_continuation")  // no answer to find: LongContinuation below
            for (const auto & s : make(t, {256, 1024}, {0.0, 0.5, 1.0})) {
                SCOPED_TRACE(s.id);
                EXPECT_EQ(s.task, t);
                EXPECT_EQ(s.metric, "string_match_all");
                const int64_t target = s.meta["target_tokens"].get<int64_t>();
                const int64_t n = count_words(s.context);
                EXPECT_EQ(s.meta["context_tokens"].get<int64_t>(), n);
                EXPECT_LE(n, target);
                EXPECT_GE(double(n), 0.8 * double(target));
                ASSERT_EQ(s.questions.size(), t == "many_facts" ? 6u : 1u);
                const std::string ctx = lower(s.context);
                for (const auto & q : s.questions) {
                    EXPECT_FALSE(q.question.empty());
                    ASSERT_FALSE(q.answers.empty());
                    for (const auto & a : q.answers) {
                        EXPECT_FALSE(a.empty());
                        EXPECT_NE(ctx.find(lower(a)), std::string::npos) << a;
                    }
                }
                const int64_t off = s.meta["needle_offset"].get<int64_t>();
                if (t == "ruler_cwe" || t == "ruler_fwe") {
                    EXPECT_EQ(off, -1);
                    EXPECT_EQ(s.meta["depth"].get<double>(), -1.0);
                } else {
                    ASSERT_GE(off, 0);
                    ASSERT_LT(size_t(off), s.context.size());
                    EXPECT_DOUBLE_EQ(s.meta["needle_depth"].get<double>(), double(off) / double(s.context.size()));
                }
            }
}

// The long-generation task: an essay excerpt that fits its length, one request to continue it,
// every answer exactly long_tokens tokens, scored by its fidelity to the full cache.
TEST_F(EvalTasks, LongContinuation) {
    TaskOptions o;
    o.lengths = {300, 1000};
    o.n_samples = 2;
    o.long_tokens = 1500;
    const auto samples = eval::make_task("long_continuation", o, haystack(), count_words);
    ASSERT_EQ(samples.size(), 4u);
    for (const auto & s : samples) {
        SCOPED_TRACE(s.id);
        EXPECT_EQ(s.metric, "fidelity");
        EXPECT_EQ(s.answer_tokens, 1500);
        EXPECT_EQ(s.meta["answer_tokens"].get<int64_t>(), 1500);
        const int64_t n = count_words(s.context), target = s.meta["target_tokens"].get<int64_t>();
        EXPECT_LE(n, target);
        EXPECT_GE(double(n), 0.9 * double(target));
        ASSERT_EQ(s.questions.size(), 1u);
        EXPECT_TRUE(s.questions[0].answers.empty());
    }
    EXPECT_NE(samples[0].context, samples[1].context);
    o.long_tokens = 0;
    EXPECT_THROW(eval::make_task("long_continuation", o, haystack(), count_words), Error);
}

TEST_F(EvalTasks, IdsUniqueAndStable) {
    std::set<std::string> ids;
    size_t n = 0;
    for (const auto & t : all_tasks())
        for (const auto & s : make(t, {256, 512}, {0.25, 0.75}, 2, 3)) {
            ids.insert(s.id);
            ++n;
        }
    EXPECT_EQ(ids.size(), n);
    EXPECT_TRUE(ids.count("niah/L256/d0.25/s3/i1"));
    EXPECT_TRUE(ids.count("ruler_cwe/L512/s3/i0"));  // no depth: one sample per length and index
    EXPECT_EQ(make("ruler_vt", {256}, {0.1, 0.2, 0.3}).size(), 1u);
}

TEST_F(EvalTasks, NeedleAtRequestedDepth) {
    for (const auto & t : all_tasks()) {
        if (!is_niah(t) && t != "passkey") continue;
        for (const auto & s : make(t, {256, 1024}, {0.0, 0.25, 0.5, 1.0})) {
            SCOPED_TRACE(s.id);
            const double depth = s.meta["depth"].get<double>();
            const double tol = t == "passkey" && s.meta["target_tokens"] == 256 ? 0.15 : 0.1;  // its instructions
            EXPECT_NEAR(s.meta["needle_depth"].get<double>(), depth, tol);
            const size_t off = s.meta["needle_offset"].get<size_t>();
            std::string needle;
            if (s.meta.contains("needle"))
                needle = s.meta["needle"].get<std::string>();
            else
                needle = "One of the special magic numbers for " + s.meta["needles"][0]["key"].get<std::string>() +
                         " is: " + s.meta["needles"][0]["value"].get<std::string>() + ".";
            EXPECT_EQ(s.context.compare(off, needle.size(), needle), 0) << s.context.substr(off, needle.size());
            if (!is_niah(t)) continue;
            // at a sentence boundary of the filler, or failing that a word boundary
            EXPECT_TRUE(off == 0 || s.context[off - 1] == ' ');
            EXPECT_TRUE(off + needle.size() == s.context.size() || s.context[off + needle.size()] == ' ');
        }
    }
}

TEST_F(EvalTasks, RulerNeedles) {
    for (const auto & s : make("ruler_niah_multikey", {256, 1024}, {0.5}, 2)) {
        SCOPED_TRACE(s.id);
        const std::string key = s.meta["key"];
        const auto distractors = s.meta["distractor_keys"].get<std::vector<std::string>>();
        ASSERT_EQ(distractors.size(), 3u);
        EXPECT_NE(s.questions[0].question.find(key), std::string::npos);
        for (const auto & d : distractors) {
            EXPECT_NE(d, key);
            EXPECT_EQ(key.find(d), std::string::npos);
            EXPECT_EQ(d.find(key), std::string::npos);
            EXPECT_NE(s.context.find("special magic numbers for " + d + " is: "), std::string::npos) << d;
            EXPECT_EQ(s.questions[0].question.find(d), std::string::npos);
        }
        ASSERT_EQ(s.questions[0].answers.size(), 1u);
        EXPECT_NE(s.context.find("numbers for " + key + " is: " + s.questions[0].answers[0] + "."), std::string::npos);
        EXPECT_EQ(s.meta["needles"].size(), 4u);
    }
    for (const auto & s : make("ruler_niah_multivalue", {1024}, {0.25}, 2)) {
        const std::string key = s.meta["key"];
        ASSERT_EQ(s.questions[0].answers.size(), 4u);
        EXPECT_EQ(as_set(s.questions[0].answers).size(), 4u);
        for (const auto & v : s.questions[0].answers) {
            EXPECT_EQ(v.size(), 7u);
            EXPECT_NE(s.context.find("numbers for " + key + " is: " + v + "."), std::string::npos) << v;
        }
    }
    for (const auto & s : make("ruler_niah_multiquery", {1024}, {0.75}, 2)) {
        const auto keys = s.meta["keys"].get<std::vector<std::string>>();
        ASSERT_EQ(keys.size(), 4u);
        ASSERT_EQ(s.questions[0].answers.size(), 4u);
        for (size_t k = 0; k < 4; ++k) {
            EXPECT_NE(s.questions[0].question.find(keys[k]), std::string::npos);
            EXPECT_NE(s.context.find("numbers for " + keys[k] + " is: " + s.questions[0].answers[k] + "."),
                      std::string::npos);
        }
    }
    // every planted needle's offset is right
    for (const auto & s : make("ruler_niah_multiquery", {512}, {0.5}))
        for (const auto & n : s.meta["needles"]) {
            const std::string text = "One of the special magic numbers for " + n["key"].get<std::string>() +
                                     " is: " + n["value"].get<std::string>() + ".";
            EXPECT_EQ(s.context.compare(n["offset"].get<size_t>(), text.size(), text), 0);
        }
}

TEST_F(EvalTasks, CommonWordsAreTheMostCommon) {
    for (const auto & s : make("ruler_cwe", {256, 1024, 4096}, {0.5}, 2)) {
        SCOPED_TRACE(s.id);
        const auto counts = cwe_counts(s.context);
        int64_t entries = 0;
        for (const auto & [w, n] : counts) entries += n;
        EXPECT_EQ(entries, s.meta["n_words"].get<int64_t>());
        EXPECT_EQ(top_k(counts, 10), as_set(s.questions[0].answers));
        EXPECT_EQ(s.questions[0].answers.size(), 10u);
    }
}

TEST_F(EvalTasks, FrequentWordsAreTheMostFrequent) {
    for (const auto & s : make("ruler_fwe", {256, 1024, 4096}, {0.5}, 2)) {
        SCOPED_TRACE(s.id);
        const auto counts = fwe_counts(s.context);
        const std::regex coded("[a-z]{5}");
        for (const auto & [w, n] : counts) EXPECT_TRUE(std::regex_match(w, coded)) << w;
        EXPECT_EQ(top_k(counts, 3), as_set(s.questions[0].answers));
        EXPECT_EQ(s.questions[0].answers.size(), 3u);
    }
}

TEST_F(EvalTasks, VariableTrackingChain) {
    for (const auto & s : make("ruler_vt", {256, 1024}, {0.5}, 2)) {
        SCOPED_TRACE(s.id);
        const std::string value = s.meta["value"];
        // follow the assignments in the text from the value
        std::map<std::string, std::string> assign;  // variable -> value or variable
        const std::regex line("VAR ([A-Z]{5}) = (VAR ([A-Z]{5})|([0-9]+))\\.");
        for (std::sregex_iterator it(s.context.begin(), s.context.end(), line), end; it != end; ++it)
            assign[(*it)[1]] = (*it)[3].matched ? std::string((*it)[3]) : std::string((*it)[4]);
        std::set<std::string> holds;
        for (const auto & [var, rhs] : assign) {
            std::string x = rhs;
            for (int hop = 0; hop < 10 && assign.count(x); ++hop) x = assign[x];
            if (x == value) holds.insert(var);
        }
        EXPECT_EQ(holds, as_set(s.questions[0].answers));
        EXPECT_EQ(s.questions[0].answers.size(), 5u);
        EXPECT_EQ(s.questions[0].answers, s.meta["chain"].get<std::vector<std::string>>());
        EXPECT_NE(s.questions[0].question.find(value), std::string::npos);
        // the chain is in order: each line after the one it refers to
        const auto chain = s.meta["chain"].get<std::vector<std::string>>();
        for (size_t i = 1; i < chain.size(); ++i)
            EXPECT_LT(s.context.find("VAR " + chain[i - 1] + " ="), s.context.find("VAR " + chain[i] + " ="));
    }
}

TEST_F(EvalTasks, Passkey) {
    for (const auto & s : make("passkey", {256}, {0.3}, 3)) {
        const std::string key = s.questions[0].answers.at(0);
        EXPECT_TRUE(std::regex_match(key, std::regex("[1-9][0-9]{4}")));
        EXPECT_NE(s.context.find("The pass key is " + key + ". Remember it. " + key + " is the pass key."),
                  std::string::npos);
        EXPECT_NE(s.context.find("The grass is green. The sky is blue."), std::string::npos);
        EXPECT_EQ(s.questions[0].question, "What is the pass key?");
    }
}

TEST_F(EvalTasks, BadOptions) {
    auto expect_error = [](const std::function<void()> & f, const std::vector<std::string> & fragments) {
        try {
            f();
            ADD_FAILURE() << "no error; expected " << ::testing::PrintToString(fragments);
        } catch (const Error & e) {
            for (const auto & fr : fragments) EXPECT_NE(std::string(e.what()).find(fr), std::string::npos) << e.what();
        }
    };
    expect_error([] { make("nope", {256}, {0.5}); }, {"[eval]", "nope", "niah", "ruler_cwe"});
    expect_error([] { make("niah", {32}, {0.5}); }, {"32", "too small"});
    // a tokenizer of 3 characters a token: 4 needles of about 63 characters overflow 64 tokens
    expect_error(
        [] {
            TaskOptions o;
            o.lengths = {64};
            eval::make_task("ruler_niah_multiquery", o, haystack(),
                            [](const std::string & t) { return int64_t(t.size() / 3); });
        },
        {"ruler_niah_multiquery", "64", "too small", "needles"});
    expect_error([] { make("ruler_cwe", {64}, {0.5}); }, {"too small"});
    expect_error([] { make("niah", {256}, {1.5}); }, {"depth"});
    expect_error([] { make("niah", {256}, {0.5}, 0); }, {"n_samples"});
    expect_error([] { eval::make_task("niah", TaskOptions{}, eval::Haystack{}, count_words); }, {"haystack"});
    // tasks with their own filler need no haystack
    EXPECT_EQ(eval::make_task("passkey", TaskOptions{}, eval::Haystack{}, count_words).size(), 1u);
}

TEST_F(EvalTasks, LoadHaystack) {
    const std::string a = write("a.txt", "First essay."), b = write("b.txt", "Second essay.");
    const auto h = eval::load_haystack({a, b});
    EXPECT_EQ(h.text, "First essay.\n\nSecond essay.");
    EXPECT_NE(h.source.find("a.txt"), std::string::npos);
    EXPECT_NE(h.source.find("b.txt"), std::string::npos);
    try {
        eval::load_haystack({a, dir() + "/missing.txt"});
        ADD_FAILURE() << "no error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
    }
    EXPECT_GT(haystack().text.size(), 100000u);
}

TEST_F(EvalTasks, QaOwnFormat) {
    const std::string p = write(
        "mine.jsonl",
        R"({"context": "Paris is in France.", "questions": [{"question": "Where is Paris?", )"
        R"("answers": ["France"]}, {"question": "What is in France?", "answers": ["Paris", "it"]}]})"
        "\n\n"
        R"({"id": "x7", "context": "c", "metric": "exact_match", "questions": [{"question": "q", "answers": []}]})"
        "\n");
    const auto s = eval::load_qa_jsonl(p);
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].id, "mine/1");
    EXPECT_EQ(s[0].task, "qa");
    EXPECT_EQ(s[0].metric, "f1");
    EXPECT_EQ(s[0].context, "Paris is in France.");
    ASSERT_EQ(s[0].questions.size(), 2u);
    EXPECT_EQ(s[0].questions[0].question, "Where is Paris?");
    EXPECT_EQ(s[0].questions[0].answers, std::vector<std::string>{"France"});
    EXPECT_EQ(s[0].questions[1].answers, (std::vector<std::string>{"Paris", "it"}));
    EXPECT_EQ(s[1].id, "x7");
    EXPECT_EQ(s[1].metric, "exact_match");
    EXPECT_EQ(eval::load_qa_jsonl(p, "string_match_part")[0].metric, "string_match_part");
}

TEST_F(EvalTasks, QaLongBenchFormat) {
    const std::string p =
        write("lb.jsonl",
              R"({"input": "Who wrote it?", "context": "It was written by Ann.", "answers": ["Ann"], "length": 5, )"
              R"("dataset": "narrativeqa", "language": "en", "all_classes": null, "_id": "abc123"})"
              "\r\n");
    const auto s = eval::load_qa_jsonl(p);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].id, "abc123");
    EXPECT_EQ(s[0].task, "narrativeqa");
    EXPECT_EQ(s[0].metric, "f1");
    EXPECT_EQ(s[0].context, "It was written by Ann.");
    ASSERT_EQ(s[0].questions.size(), 1u);
    EXPECT_EQ(s[0].questions[0].question, "Who wrote it?");
    EXPECT_EQ(s[0].questions[0].answers, std::vector<std::string>{"Ann"});
    EXPECT_EQ(s[0].meta["length"], 5);
}

TEST_F(EvalTasks, QaErrorsNameFileAndLine) {
    const std::string good = R"({"context": "c", "input": "q", "answers": ["a"]})";
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"{not json", "invalid JSON"},
        {R"({"input": "q", "answers": ["a"]})", "context"},
        {R"({"context": "c", "answers": ["a"]})", "question"},
        {R"({"context": "c", "input": "q", "answers": "a"})", "answers"},
        {R"({"context": "c", "input": "q", "answers": [1]})", "answers"},
        {R"({"context": "c", "questions": [{"answers": ["a"]}]})", "question"},
        {R"({"context": "c", "questions": [{"question": "q", "answers": [null]}]})", "answers"},
        {R"({"context": "c", "input": "q", "answers": ["a"], "metric": "bleu"})", "metric"},
        {"[1, 2]", "object"},
    };
    for (size_t i = 0; i < bad.size(); ++i) {
        const std::string name = "bad" + std::to_string(i) + ".jsonl";
        const std::string p = write(name, good + "\n\n" + bad[i].first + "\n" + good + "\n");
        try {
            eval::load_qa_jsonl(p);
            ADD_FAILURE() << "no error for " << bad[i].first;
        } catch (const Error & e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(name + ":3"), std::string::npos) << msg;
            EXPECT_NE(msg.find(bad[i].second), std::string::npos) << msg;
        }
    }
    EXPECT_THROW(eval::load_qa_jsonl(dir()), Error);  // a directory
    try {
        eval::load_qa_jsonl(dir() + "/absent.jsonl");
        ADD_FAILURE() << "no error";
    } catch (const Error & e) {
        EXPECT_NE(std::string(e.what()).find("absent.jsonl"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kvlab
