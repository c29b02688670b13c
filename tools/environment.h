// The process environment as the CLI reads it (app/environment.h lists the variables): read here
// in tools/ once, at first use, and passed down as options.
#pragma once

#include "app/environment.h"

namespace kvlab::cli {

using app::Environment;

// Read once, at first use.
const Environment & environment();

}  // namespace kvlab::cli
