// Backend logging: ggml and libllama print only warnings and errors unless
// KVLAB_VERBOSE=1 is set in the environment.
#pragma once

namespace kvlab {

void init_backend_logging();

}  // namespace kvlab
