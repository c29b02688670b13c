// The provenance record embedded in every result kvlab writes: which model file
// (hashes), which hyper-parameters, which build, which machine.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvlab {

class Model;
class Tokenizer;

std::string kvlab_version();
std::string kvlab_git_commit();

// The hyper-parameters of a loaded model as provenance records them, and their sha256 (of
// the canonical JSON): what a cache file must match besides the model file's sha256.
nlohmann::json hparams_json(const Model & model);
std::string hparams_hash(const Model & model);

// The full record for a loaded model (computes the file's sha256 once; cached by path,
// size and mtime).
nlohmann::json provenance(const Model & model, const Tokenizer & tok);

}  // namespace kvlab
