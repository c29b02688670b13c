// What the front ends (tools/, python/) take from the process environment: the caches, the model
// store and pip, the data folder, and whether ggml and libllama may speak. A front end reads the
// variables and passes their values here; nothing below the front ends reads one.
//   KVLAB_CACHE      kvlab's caches (file hashes, scorers, the server's contexts); default ~/.cache/kvlab
//   KVLAB_MODEL_DIR  the model cache; default ~/.cache/kvlab/models
//   KVLAB_PYTHON     the Python whose pip fetches models; default python3
//   KVLAB_PIP_ARGS   more arguments for that pip, split on spaces (e.g. --find-links DIR --no-index)
//   KVLAB_DATA_DIR   a folder holding haystack/ (the bundled essays), searched first
//   KVLAB_VERBOSE    1: ggml's and libllama's own messages on stderr (default: errors only)
#pragma once

#include <functional>
#include <string>

#include "kvlab/registry.h"

namespace kvlab::app {

struct Environment {
    std::string cache_dir;
    ModelStore models;
    std::string data_dir;  // "" when not set
    bool verbose = false;
};

// The environment from the variables' values: var(name) is "" for a variable that is not set.
Environment environment_from(const std::function<std::string(const char * name)> & var);

}  // namespace kvlab::app
