#include "target.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "kvlab/error.h"
#include "support/tiny_gguf.h"

namespace kvlab::fuzz {

namespace {

std::map<std::string, Target> & registry() {
    static std::map<std::string, Target> r;
    return r;
}

// The process's private directory, removed at exit (when the static goes).
struct ScratchDir {
    std::string path = (std::filesystem::temp_directory_path() / ("kvlab-fuzz-" + std::to_string(getpid()))).string();
    ScratchDir() { std::filesystem::create_directories(path); }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
};

const std::string & scratch_dir() {
    static const ScratchDir dir;
    return dir.path;
}

}  // namespace

void register_target(const Target & t) {
    KVLAB_ASSERT(!registry().count(t.name), "fuzz target registered twice");
    registry()[t.name] = t;
}

const Target * find_target(const std::string & name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : &it->second;
}

std::vector<std::string> target_names() {
    std::vector<std::string> out;
    for (const auto & [name, _] : registry()) out.push_back(name);
    return out;
}

std::string input_file(const uint8_t * data, size_t size, const std::string & suffix) {
    const std::string path = scratch_dir() + "/input" + suffix;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(data), std::streamsize(size));
    out.close();
    if (!out) throw std::runtime_error("fuzz: cannot write " + path);
    return path;
}

void write_seed(const std::string & dir, const std::string & name, const std::string & bytes) {
    std::filesystem::create_directories(dir);
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out << bytes;
    if (!out) throw std::runtime_error("fuzz: cannot write seed " + dir + "/" + name);
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("fuzz: cannot read " + path);
    return {std::istreambuf_iterator<char>(in), {}};
}

const Model & tiny_model() {
    static const std::unique_ptr<Model> model = [] {
        test::TinySpec spec;
        spec.arch = "llama";
        spec.n_ctx_train = 256;
        spec.head_dim = 32;  // whole Q8_0 / Q4_0 blocks: cache files of quantized and mixed rows
        const std::string path = scratch_dir() + "/tiny.gguf";
        test::write_tiny_gguf(spec, test::default_model_path(), path);
        return Model::load(path, {.n_threads = 1});
    }();
    return *model;
}

}  // namespace kvlab::fuzz
