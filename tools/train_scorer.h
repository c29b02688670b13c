// What `kvlab demo` shares with `kvlab train-scorer`: training a model's KVzap scorer with every
// default (the default corpus, linear, into kvlab's cache), as the set-up does.
#pragma once

#include <string>

namespace kvlab::cli {

// Trains `model`'s linear scorer into its default path unless it is there; 0 on success.
int train_default_scorer(const std::string & model, int threads);

}  // namespace kvlab::cli
