// Backend logging: what ggml and libllama print on stderr. Their log callbacks are the libraries'
// own process-wide state, so the program sets them once, at start (the tools from
// $KVLAB_VERBOSE): errors only, or every message when verbose.
#pragma once

namespace kvlab {

void set_backend_logging(bool verbose);

}  // namespace kvlab
