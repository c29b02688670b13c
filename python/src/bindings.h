// kvlab's Python module (`import kvlab`; docs/python.md): the seed's backend API over kvlab's
// engine. A front end like tools/, on the same floor (src/app/: loading by name, the environment's
// stores, options from strings, compressing in place); the objects it shares between the binding
// files are declared here.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "app/environment.h"
#include "app/load.h"
#include "kvlab/cache.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/press.h"

namespace kvlab::py {

namespace pb = pybind11;

// A loaded model: weights, tokenizer and one engine. The engine computes one call at a time
// (`lock`, taken through ModelLock): Python threads that share a model wait for each other, the
// GIL released meanwhile.
struct PyModel {
    app::Loaded loaded;
    std::unique_ptr<Engine> engine;
    double load_ms = 0.0;
    std::mutex lock;
    std::atomic<std::thread::id> holder{};  // the thread that holds `lock` (none: the default id)
    const Model & model() const { return *loaded.model; }
    const Tokenizer & tok() const { return *loaded.tok; }
};

// Holds a model's lock for one engine call; construct it with the GIL released. A Python scorer
// runs while kvlab.compress holds the lock: when it calls its own model it gets kvlab.Error,
// not a deadlock (std::mutex is not recursive).
class ModelLock {
public:
    explicit ModelLock(PyModel & pm) : pm_(pm) {
        if (pm.holder.load() == std::this_thread::get_id())
            throw Error("python",
                        "this model is busy in kvlab.compress on this thread: a Python scorer cannot call "
                        "its own model");
        pm.lock.lock();
        pm.holder = std::this_thread::get_id();
    }
    ~ModelLock() {
        pm_.holder = std::thread::id();
        pm_.lock.unlock();
    }
    ModelLock(const ModelLock &) = delete;
    ModelLock & operator=(const ModelLock &) = delete;

private:
    PyModel & pm_;
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

// The process environment (app/environment.h lists the variables), read once at first use.
const app::Environment & environment();

// JSON to Python objects and back, through Python's json module (invalid UTF-8 replaced).
pb::object json_to_python(const nlohmann::json & j);
nlohmann::json json_from_python(const pb::object & o);

// A float32 NumPy array that owns `v` (no copy).
pb::array_t<float> to_numpy(std::vector<float> && v, std::vector<pb::ssize_t> shape);

// The token ids of a Python sequence, each checked against the vocabulary.
std::vector<int32_t> token_ids(const PyModel & m, const std::vector<int64_t> & ids, const char * what);

void bind_model(pb::module_ & m);
void bind_cache(pb::module_ & m);
void bind_compress(pb::module_ & m);
void bind_eval(pb::module_ & m);

// The press of a Python scorer (scorer.cpp): `scorer` is a callable or has a `score` method;
// `options` the keyword arguments compress() got (per, n_sink, window, alpha). Made and dropped
// with the GIL held (it holds the scorer's Python objects).
std::unique_ptr<Press> scorer_press(const pb::object & scorer, const pb::kwargs & options, const Model & model);

}  // namespace kvlab::py
