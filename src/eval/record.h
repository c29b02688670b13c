// The answer record of the evaluation (one JSONL line; the schema is in report.h).
#pragma once

#include <nlohmann/json.hpp>

#include "eval/metrics.h"
#include "eval/plan.h"
#include "kvlab/session.h"

namespace kvlab::eval {

struct AnswerFacts {
    const Sample * sample = nullptr;
    size_t question = 0;
    const EvalConfig * config = nullptr;
    const PreparedCache * prepared = nullptr;
    nlohmann::json method_params;  // resolved parameters ({} for the full cache)
    bool query_aware = false;
    bool multi_turn = false;
    int64_t context_tokens = 0;
    double prefill_s = 0.0;
    const GenerateResult * result = nullptr;
    std::string text;
    Fidelity fidelity;
    bool identical = false;        // the same tokens as the full cache's answer
    nlohmann::json decode_policy;  // the decoding policy's figures of the answer (null: none ran)
};

nlohmann::json answer_record(const AnswerFacts & f);

}  // namespace kvlab::eval
