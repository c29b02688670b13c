// kvlab's Python module (`import kvlab`; docs/python.md): the seed's backend API over kvlab's
// engine. A front end like tools/ (it takes the environment's model store and caches through
// tools/environment.h); the objects it shares between the binding files are declared here.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.h"
#include "kvlab/cache.h"
#include "kvlab/engine.h"

namespace kvlab::py {

namespace pb = pybind11;

// A loaded model: weights, tokenizer and one engine. The engine computes one call at a time
// (`lock`): Python threads that share a model wait for each other, the GIL released meanwhile.
struct PyModel {
    cli::Loaded loaded;
    std::unique_ptr<Engine> engine;
    double load_ms = 0.0;
    std::mutex lock;
    const Model & model() const { return *loaded.model; }
    const Tokenizer & tok() const { return *loaded.tok; }
};

// A KV cache of a model: the store, and the tokens prefilled into it from position 0 while it
// was still a plain prefill (what a method that observes the prefill re-reads; empty once the
// cache was compressed or fed anything else).
struct PyCache {
    std::shared_ptr<PyModel> owner;
    std::unique_ptr<KvStore> store;
    std::vector<int32_t> context;
    bool pristine = true;  // only prefills from position 0, nothing compressed or generated
};

// A float32 NumPy array that owns `v` (no copy).
pb::array_t<float> to_numpy(std::vector<float> && v, std::vector<pb::ssize_t> shape);

// The token ids of a Python sequence, each checked against the vocabulary.
std::vector<int32_t> token_ids(const PyModel & m, const std::vector<int64_t> & ids, const char * what);

void bind_model(pb::module_ & m);
void bind_cache(pb::module_ & m);
void bind_compress(pb::module_ & m);

}  // namespace kvlab::py
