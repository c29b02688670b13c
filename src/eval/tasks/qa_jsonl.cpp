// The loader of QA datasets in JSONL: kvlab's own format ({context, questions: [{question,
// answers}]}) and LongBench's ({context, input, answers, _id / dataset}).
#include <filesystem>
#include <fstream>
#include <set>

#include "eval/tasks.h"
#include "kvlab/error.h"

namespace kvlab::eval {
namespace {

using json = nlohmann::json;

const std::set<std::string> kMetrics = {"string_match_all", "string_match_part", "exact_match", "f1"};

std::vector<std::string> string_list(const json & j, const std::string & where) {
    if (!j.is_array()) throw Error("eval", where + ": answers must be a list of strings");
    std::vector<std::string> r;
    for (const auto & a : j) {
        if (!a.is_string()) throw Error("eval", where + ": answers must be a list of strings");
        r.push_back(a.get<std::string>());
    }
    return r;
}

std::string id_text(const json & j) {
    return j.is_string() ? j.get<std::string>() : j.dump();
}

}  // namespace

std::vector<Sample> load_qa_jsonl(const std::string & path, const std::string & metric) {
    if (!kMetrics.count(metric)) throw Error("eval", path + ": unknown metric '" + metric + "'");
    std::ifstream in(path, std::ios::binary);
    if (!in || !std::filesystem::is_regular_file(path)) throw Error("eval", "cannot read QA dataset " + path);
    const std::string stem = std::filesystem::path(path).stem().string();
    std::vector<Sample> out;
    std::set<std::string> ids;
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
        if (n == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 byte order mark
        if (line.find_first_not_of(" \t\r\n") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(n);
        json j;
        try {
            j = json::parse(line);
        } catch (const json::exception & e) {
            throw Error("eval", where + ": invalid JSON: " + e.what());
        }
        if (!j.is_object()) throw Error("eval", where + ": not a JSON object");
        if (!j.contains("context")) throw Error("eval", where + ": missing \"context\"");
        if (!j["context"].is_string()) throw Error("eval", where + ": \"context\" is not a string");
        Sample s;
        s.context = j["context"].get<std::string>();
        if (j.contains("questions")) {
            if (!j["questions"].is_array() || j["questions"].empty())
                throw Error("eval", where + ": \"questions\" must be a non-empty list");
            for (const auto & q : j["questions"]) {
                if (!q.is_object() || !q.contains("question") || !q["question"].is_string())
                    throw Error("eval", where + ": missing question (each of \"questions\" needs a \"question\")");
                if (!q.contains("answers")) throw Error("eval", where + ": a question has no \"answers\"");
                s.questions.push_back({q["question"].get<std::string>(), string_list(q["answers"], where)});
            }
        } else if (j.contains("input")) {  // LongBench
            if (!j["input"].is_string()) throw Error("eval", where + ": \"input\" (the question) is not a string");
            if (!j.contains("answers")) throw Error("eval", where + ": missing \"answers\"");
            s.questions.push_back({j["input"].get<std::string>(), string_list(j["answers"], where)});
        } else {
            throw Error("eval", where + ": missing question (\"questions\" or LongBench's \"input\")");
        }
        s.task = j.contains("dataset") && j["dataset"].is_string() ? j["dataset"].get<std::string>() : "qa";
        s.metric = metric;
        if (j.contains("metric")) {
            if (!j["metric"].is_string() || !kMetrics.count(j["metric"].get<std::string>()))
                throw Error("eval", where + ": unknown metric " + j["metric"].dump());
            s.metric = j["metric"].get<std::string>();
        }
        s.id = j.contains("id")    ? id_text(j["id"])
               : j.contains("_id") ? id_text(j["_id"])
                                   : stem + "/" + std::to_string(n);
        if (!ids.insert(s.id).second) throw Error("eval", where + ": duplicate id '" + s.id + "'");
        s.meta = json::object();
        for (const auto & [k, v] : j.items())
            if (k != "context" && k != "questions" && k != "input" && k != "answers") s.meta[k] = v;
        s.meta["source"] = path;
        s.meta["line"] = n;
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace kvlab::eval
