// Fuzz target `qa_jsonl`: a JSONL file from outside, read as a QA dataset (`qa:PATH` tasks:
// kvlab's own format and LongBench's) and as result records (`kvlab report`'s inputs).
#include <nlohmann/json.hpp>

#include "eval/report.h"
#include "eval/tasks.h"
#include "kvlab/error.h"
#include "support/fixtures.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

void one(const uint8_t * data, size_t size) {
    const std::string path = input_file(data, size, ".jsonl");
    try {
        (void)eval::load_qa_jsonl(path);
    } catch (const Error &) {
    }
    try {
        (void)eval::read_records({path});
    } catch (const Error &) {
    }
}

// A QA dataset in kvlab's format and in LongBench's, and result records: the header of the
// committed demo run (docs/results/demo-header.json) with answers as kvlab eval writes them.
void seeds(const std::string & dir) {
    write_seed(
        dir, "kvlab.jsonl",
        R"({"id": "a", "context": "The code is 7431. The door is blue.", "questions": [{"question": "What is the code?", "answers": ["7431"]}, {"question": "What colour is the door?", "answers": ["blue"], "metric": "contains"}]})"
        "\n"
        R"({"id": "b", "context": "Paris is the capital of France.", "questions": [{"question": "Capital of France?", "answers": ["Paris"]}], "metric": "em"})"
        "\n");
    write_seed(
        dir, "longbench.jsonl",
        R"({"_id": "lb1", "context": "A long passage about rivers.", "input": "Which river?", "answers": ["the Nile"], "length": 5, "dataset": "narrativeqa"})"
        "\n");
    const nlohmann::json header =
        nlohmann::json::parse(read_file(test::source_dir() + "/docs/results/demo-header.json"));
    write_seed(
        dir, "records.jsonl",
        header.dump() + "\n" +
            R"({"kind": "answer", "sample_id": "niah-0", "question_index": 0, "method": "snapkv", "budget_label": "ratio 0.5", "score": 1.0, "answer": "7431", "kl_full": 0.01, "ttft_s": 0.2})"
            "\n");
}

const FuzzRegistrar reg({"qa_jsonl", [] {}, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
