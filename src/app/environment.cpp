#include "app/environment.h"

#include <sstream>

namespace kvlab::app {

Environment environment_from(const std::function<std::string(const char *)> & var) {
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

}  // namespace kvlab::app
