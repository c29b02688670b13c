// What kvlab takes from the process environment, read here in tools/ and nowhere below (the
// layers below take it as options): the caches, the model store and pip, the data folder, and
// whether ggml and libllama may speak.
//   KVLAB_CACHE      kvlab's caches (file hashes, the server's contexts); default ~/.cache/kvlab
//   KVLAB_MODEL_DIR  the model cache; default ~/.cache/kvlab/models
//   KVLAB_PYTHON     the Python whose pip fetches models; default python3
//   KVLAB_PIP_ARGS   more arguments for that pip, split on spaces (e.g. --find-links DIR --no-index)
//   KVLAB_DATA_DIR   a folder holding haystack/ (the bundled essays), searched first
//   KVLAB_VERBOSE    1: ggml's and libllama's own messages on stderr (default: errors only)
#pragma once

#include <string>

#include "kvlab/registry.h"

namespace kvlab::cli {

struct Environment {
    std::string cache_dir;
    ModelStore models;
    std::string data_dir;  // "" when not set
    bool verbose = false;
};

// Read once, at first use.
const Environment & environment();

}  // namespace kvlab::cli
