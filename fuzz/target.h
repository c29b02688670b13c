// Fuzz targets: each parser kvlab runs on bytes from outside (GGUF models, cache files, QA
// JSONL and result records, experiment files, HTTP request bodies) behind one entry point.
// A target file registers itself (FuzzRegistrar); the libFuzzer driver (driver.cpp, the
// KVLAB_FUZZ build) runs the one named by $KVLAB_FUZZ_TARGET, and the test suite replays
// every committed input of fuzz/corpus/<name>/ through the same functions
// (tests/test_fuzz_replay.cpp) in the normal and the sanitizer builds.
//
// The contract a target checks: an input is either accepted or refused with kvlab::Error
// (the server's ApiError for request bodies). Anything else escapes the target — another
// exception, an abort, a sanitizer report, a hang — and is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvlab/model.h"

namespace kvlab::fuzz {

struct Target {
    std::string name;
    void (*init)();                                  // once, before the first input
    void (*one)(const uint8_t * data, size_t size);  // one input
    // Writes the seed inputs into dir: built from real files (kvlab's own writers, the
    // default model's vocabulary, the committed experiments and results), small.
    void (*seeds)(const std::string & dir);
};

void register_target(const Target & t);
const Target * find_target(const std::string & name);
std::vector<std::string> target_names();

struct FuzzRegistrar {
    explicit FuzzRegistrar(const Target & t) { register_target(t); }
};

// The input as a file (one per process, rewritten for each input) under a private temp
// directory that goes at exit; `suffix` e.g. ".gguf".
std::string input_file(const uint8_t * data, size_t size, const std::string & suffix);

// A tiny llama model (2 layers, 64 wide, the default model's vocabulary) written once per
// process and loaded with 1 thread: what cache files and method parameters are checked
// against. Needs the default model (scripts/models.sh smollm2-135m).
const Model & tiny_model();

// Writes bytes to dir/name (a seed).
void write_seed(const std::string & dir, const std::string & name, const std::string & bytes);
// The whole of a file (a committed file a seed is made from).
std::string read_file(const std::string & path);

}  // namespace kvlab::fuzz
