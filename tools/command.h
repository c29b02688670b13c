// The subcommand seam: each tools/cmd_*.cpp registers its subcommand(s) at static
// initialisation; main() adds every registered one to the app. Adding a subcommand is one
// file: `const CommandRegistrar reg("name", [](CLI::App & app, int & rc) { ... });`
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace kvlab::cli {

// Adds the subcommand to the app; its callback stores the exit code in rc.
using CommandSetup = std::function<void(CLI::App & app, int & rc)>;

struct CommandRegistrar {
    CommandRegistrar(std::string name, CommandSetup setup);
};

// Adds every registered subcommand, in name order.
void add_commands(CLI::App & app, int & rc);

}  // namespace kvlab::cli
