// kvlab report DIR_OR_FILES... [--out DIR]: merges result shards into summary.md, SVG plots
// and report.html, and prints the table.
#include <filesystem>

#include "common.h"
#include "eval_cli.h"
#include "kvlab/error.h"

namespace kvlab::cli {

namespace {

namespace fs = std::filesystem;

// The records files named by the inputs (a directory gives its records-*.jsonl).
std::vector<std::string> record_files(const std::vector<std::string> & inputs) {
    std::vector<std::string> files;
    for (const std::string & in : inputs) {
        std::error_code ec;
        if (fs::is_directory(in, ec)) {
            std::vector<std::string> f;
            fs::directory_iterator it(in, ec);
            if (ec) throw Error("report", "cannot list " + in + ": " + ec.message());
            for (const auto & e : it)
                if (e.path().filename().string().rfind("records-", 0) == 0 && e.path().extension() == ".jsonl")
                    f.push_back(e.path().string());
            std::sort(f.begin(), f.end());
            if (f.empty()) throw Error("report", in + ": no records-*.jsonl files");
            files.insert(files.end(), f.begin(), f.end());
        } else if (fs::exists(in, ec)) {
            files.push_back(in);
        } else {
            throw Error("report", "no such file or directory: " + in);
        }
    }
    return files;
}

const CommandRegistrar reg("report", [](CLI::App & app, int & rc) {
    auto * cmd = app.add_subcommand("report", "Merge result shards into summary.md, SVG plots and report.html");
    auto inputs = std::make_shared<std::vector<std::string>>();
    auto out = std::make_shared<std::string>();
    cmd->add_option("INPUTS", *inputs, "result directories or records-*.jsonl files")->required();
    cmd->add_option("-o,--out", *out, "where to write the report (default: the first input directory)");
    cmd->callback([&rc, inputs, out] {
        const std::vector<std::string> files = record_files(*inputs);
        std::error_code ec;
        const std::string dir = !out->empty()                        ? *out
                                : fs::is_directory(inputs->front(), ec) ? inputs->front()
                                                                        : fs::path(inputs->front()).parent_path().string();
        write_report(files, dir.empty() ? "." : dir, true);
        rc = 0;
    });
});

}  // namespace

}  // namespace kvlab::cli
