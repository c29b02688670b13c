// kvlab: prefill a context once, compress its KV cache, answer many queries from copies,
// and measure what each method costs and keeps.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "command.h"
#include "environment.h"
#include "ggml.h"
#include "kvlab/error.h"
#include "kvlab/log.h"
#include "kvlab/provenance.h"

namespace {
// The last resort: an assertion inside ggml or libllama that kvlab's own checks did not
// catch first ends the process with one line (and exit code 1), not a debugger's backtrace.
void on_ggml_abort(const char * message) {
    std::fprintf(stderr, "kvlab: error: [ggml] internal check failed: %s (a malformed input file, or a bug)\n",
                 message);
    std::fflush(stderr);
    std::_Exit(1);
}

// llama.cpp's multi-letter short flags, which CLI11 does not parse, as their long names.
std::vector<const char *> with_llama_aliases(int argc, char ** argv) {
    std::vector<const char *> out(argv, argv + argc);
    for (const char *& a : out) {
        if (std::strcmp(a, "-ctk") == 0) a = "--cache-type-k";
        if (std::strcmp(a, "-ctv") == 0) a = "--cache-type-v";
    }
    return out;
}
}  // namespace

int main(int argc, char ** argv) {
    ggml_set_abort_callback(on_ggml_abort);
    kvlab::set_backend_logging(kvlab::cli::environment().verbose);
    // a write past a file-size limit fails with EFBIG (an error naming the file) instead of
    // killing the process with SIGXFSZ
    std::signal(SIGXFSZ, SIG_IGN);
    CLI::App app{"kvlab " + kvlab::kvlab_version() +
                 ": a KV-cache reuse and compression engine and laboratory for GGUF models.\n"
                 "MODEL is a short name (see `kvlab models`; fetched with pip on first use) or a .gguf path."};
    app.require_subcommand(1);
    app.set_version_flag("--version", kvlab::kvlab_version() + " (" + kvlab::kvlab_git_commit() + ")");
    app.option_defaults()->always_capture_default();  // every --help shows the defaults
    app.fallthrough();                                // the options below also after the command's name
    int rc = 0;
    kvlab::cli::add_commands(app, rc);
    try {
        std::vector<const char *> args = with_llama_aliases(argc, argv);
        app.parse(int(args.size()), args.data());
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    } catch (const kvlab::Error & e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        return 1;
    } catch (const std::exception & e) {  // a library's exception that no boundary translated: a kvlab bug
        std::fprintf(stderr, "kvlab: internal error (please report): %s\n", e.what());
        return 1;
    }
    return rc;
}
