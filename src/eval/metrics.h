// Evaluation metrics: task scores on the answer text, and fidelity of a compressed cache
// to the full cache along the full cache's answer (teacher-forced).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab::eval {

// RULER's string match, case-insensitive: all = fraction of the references contained in
// the prediction; part = 1 if any reference is contained, else 0.
double string_match_all(const std::string & prediction, const std::vector<std::string> & refs);
double string_match_part(const std::string & prediction, const std::vector<std::string> & refs);
// SQuAD's normalisation (lower case, no punctuation, no articles a/an/the, single spaces);
// the best over the references.
std::string normalize_answer(const std::string & s);
double exact_match(const std::string & prediction, const std::vector<std::string> & refs);
double token_f1(const std::string & prediction, const std::vector<std::string> & refs);
// By name: "string_match_all" | "string_match_part" | "exact_match" | "f1"; throws otherwise.
double score(const std::string & metric, const std::string & prediction, const std::vector<std::string> & refs);

// KL(p || q) in nats of the softmax distributions of two logit rows (p: the full cache).
double kl_divergence(const float * logits_p, const float * logits_q, int64_t n_vocab);

struct Fidelity {
    double kl_mean = 0.0;         // mean KL(full || compressed) over the positions
    double kl_max = 0.0;
    double top1_agreement = 0.0;  // fraction of positions where both argmax agree
    int64_t n_positions = 0;
};
// Rows are [n][n_vocab] logits at the same teacher-forced positions.
Fidelity fidelity(const std::vector<float> & full, const std::vector<float> & compressed, int64_t n_vocab);

}  // namespace kvlab::eval
