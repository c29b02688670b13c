#include "environment.h"

#include <cstdlib>

namespace kvlab::cli {

const Environment & environment() {
    static const Environment e = app::environment_from([](const char * name) {
        const char * v = std::getenv(name);
        return std::string(v ? v : "");
    });
    return e;
}

}  // namespace kvlab::cli
