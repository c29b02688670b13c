#include "kvlab/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ggml.h"
#include "llama.h"

namespace kvlab {

namespace {
void filtered_log(ggml_log_level level, const char * text, void * verbose) {
    if (verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}
}  // namespace

void init_backend_logging() {
    const char * v = std::getenv("KVLAB_VERBOSE");
    void * verbose = (v && std::strcmp(v, "0") != 0) ? reinterpret_cast<void *>(1) : nullptr;
    llama_log_set(filtered_log, verbose);
    ggml_log_set(filtered_log, verbose);
}

}  // namespace kvlab
