#include "command.h"

#include <map>

#include "kvlab/error.h"

namespace kvlab::cli {

namespace {
std::map<std::string, CommandSetup> & registry() {
    static std::map<std::string, CommandSetup> r;
    return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(std::string name, CommandSetup setup) {
    KVLAB_ASSERT(!registry().count(name), "subcommand registered twice");
    registry().emplace(std::move(name), std::move(setup));
}

void add_commands(CLI::App & app, int & rc) {
    for (auto & [name, setup] : registry()) setup(app, rc);
}

}  // namespace kvlab::cli
