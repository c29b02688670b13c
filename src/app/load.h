// A model by short name or .gguf path, loaded for a front end: the path resolved (a known model
// fetched on first use, app/fetch.h), the weights and the tokenizer, checked against each other.
#pragma once

#include <memory>
#include <string>

#include "kvlab/model.h"
#include "kvlab/registry.h"
#include "kvlab/text.h"

namespace kvlab::app {

struct Loaded {
    std::string path;
    std::unique_ptr<Model> model;
    std::unique_ptr<Tokenizer> tok;
};

// Resolves a short name or path in `store` (fetching a known model if needed) and loads it. With
// opts.n_threads 0 (the idle CPUs), says on stderr when other work keeps some CPUs busy.
Loaded load(const std::string & name_or_path, const ModelOptions & opts, const ModelStore & store);

// -t 0: the CPUs other work leaves idle (idle_cpus()), said on stderr; else `requested`.
int resolve_threads(int requested);

}  // namespace kvlab::app
