// The project's bundled haystack essays, found beside the executable or the working directory.
#include <algorithm>
#include <filesystem>

#include "eval/runner.h"
#include "kvlab/error.h"

namespace kvlab::eval {

namespace fs = std::filesystem;

std::vector<std::string> default_haystack(const std::string & data_dir) {
    std::vector<fs::path> roots;
    if (!data_dir.empty()) roots.emplace_back(data_dir);
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        roots.push_back(exe.parent_path().parent_path() / "data");
        roots.push_back(exe.parent_path().parent_path().parent_path() / "data");
    }
    roots.push_back(fs::current_path() / "data");
    for (const fs::path & r : roots) {
        const fs::path dir = r / "haystack";
        if (!fs::is_directory(dir, ec)) continue;
        std::vector<std::string> files;
        for (const auto & e : fs::directory_iterator(dir))
            if (e.path().extension() == ".txt") files.push_back(e.path().string());
        std::sort(files.begin(), files.end());
        if (!files.empty()) return files;
    }
    throw Error("eval", "cannot find the haystack essays (data/haystack); set KVLAB_DATA_DIR or give haystack files");
}

}  // namespace kvlab::eval
