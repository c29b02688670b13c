#include "environment.h"

#include <cstdlib>
#include <sstream>

namespace kvlab::cli {

namespace {

std::string var(const char * name) {
    const char * v = std::getenv(name);
    return v ? v : "";
}

Environment read_environment() {
    Environment e;
    const std::string home = var("HOME").empty() ? "." : var("HOME");
    e.cache_dir = var("KVLAB_CACHE").empty() ? home + "/.cache/kvlab" : var("KVLAB_CACHE");
    e.models.dir = var("KVLAB_MODEL_DIR").empty() ? home + "/.cache/kvlab/models" : var("KVLAB_MODEL_DIR");
    if (!var("KVLAB_PYTHON").empty()) e.models.python = var("KVLAB_PYTHON");
    std::istringstream args(var("KVLAB_PIP_ARGS"));
    for (std::string a; args >> a;) e.models.pip_args.push_back(a);
    e.data_dir = var("KVLAB_DATA_DIR");
    e.verbose = !var("KVLAB_VERBOSE").empty() && var("KVLAB_VERBOSE") != "0";
    return e;
}

}  // namespace

const Environment & environment() {
    static const Environment e = read_environment();
    return e;
}

}  // namespace kvlab::cli
