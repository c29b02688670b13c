#include "kvlab/log.h"

#include <cstdio>

#include "ggml.h"
#include "llama.h"

namespace kvlab {

namespace {
void filtered_log(ggml_log_level level, const char * text, void * verbose) {
    if (verbose || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}
}  // namespace

void set_backend_logging(bool verbose) {
    void * v = verbose ? reinterpret_cast<void *>(1) : nullptr;
    llama_log_set(filtered_log, v);
    ggml_log_set(filtered_log, v);
}

}  // namespace kvlab
