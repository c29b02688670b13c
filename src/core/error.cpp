#include "kvlab/error.h"

#include <cstdio>
#include <cstdlib>

namespace kvlab {

void assert_fail(const char * expr, const char * file, int line, const char * msg) {
    std::fprintf(stderr, "[kvlab] internal invariant broken: %s (%s) at %s:%d\n", msg, expr, file, line);
    std::abort();
}

}  // namespace kvlab
