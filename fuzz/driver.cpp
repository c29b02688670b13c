// libFuzzer's entry points for the KVLAB_FUZZ build: the target named by $KVLAB_FUZZ_TARGET
// (scripts/fuzz.sh NAME sets it); with $KVLAB_FUZZ_WRITE_SEEDS=DIR it writes the target's
// seeds into DIR and exits.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "target.h"

namespace {
const kvlab::fuzz::Target * g_target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    const char * name = std::getenv("KVLAB_FUZZ_TARGET");
    g_target = name ? kvlab::fuzz::find_target(name) : nullptr;
    if (!g_target) {
        std::string known;
        for (const auto & n : kvlab::fuzz::target_names()) known += " " + n;
        std::fprintf(stderr, "kvlab_fuzz: set KVLAB_FUZZ_TARGET to one of:%s\n", known.c_str());
        std::exit(2);
    }
    g_target->init();
    if (const char * dir = std::getenv("KVLAB_FUZZ_WRITE_SEEDS")) {  // scripts/fuzz.sh: the seeds, then stop
        g_target->seeds(dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    g_target->one(data, size);
    return 0;
}
