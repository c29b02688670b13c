// Fuzz target `cache_file`: a .kvc file (kvlab compress's output, a server's store) read
// against the fuzzing process's tiny model, by both readers (the metadata alone, as a server
// lists its store, and the whole load into a KV store). When the first byte of the input is
// odd, its section and header checksums are recomputed first, so that mutations reach the
// section parsers behind the checksums (as a deliberately forged file would).
#include "kvlab/cache_file.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "kvlab/engine.h"
#include "kvlab/error.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"
#include "kvlab/text.h"
#include "target.h"

namespace kvlab::fuzz {
namespace {

constexpr size_t k_fixed = 16, k_entry = 56, k_sha = 32;

void put_sha(const uint8_t * data, size_t n, uint8_t * out) {
    const std::string hex = sha256_hex(data, n);
    for (size_t i = 0; i < k_sha; ++i) out[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
}

// The section table's checksums made right for the bytes that are there (a forger's work).
void fix_checksums(std::vector<uint8_t> & b) {
    if (b.size() < k_fixed) return;
    uint32_t n = 0;
    std::memcpy(&n, b.data() + 12, 4);
    if (n == 0 || n > 16 || b.size() < k_fixed + n * k_entry + k_sha) return;
    for (uint32_t i = 0; i < n; ++i) {
        uint8_t * e = b.data() + k_fixed + i * k_entry;
        uint64_t off = 0, size = 0;
        std::memcpy(&off, e + 8, 8);
        std::memcpy(&size, e + 16, 8);
        if (off <= b.size() && size <= b.size() - off) put_sha(b.data() + off, size, e + 24);
    }
    put_sha(b.data(), k_fixed + n * k_entry, b.data() + k_fixed + n * k_entry);
}

void one(const uint8_t * data, size_t size) {
    if (size == 0) return;
    std::vector<uint8_t> bytes(data + 1, data + size);
    if (data[0] & 1) fix_checksums(bytes);
    const std::string path = input_file(bytes.data(), bytes.size(), ".kvc");
    try {
        CacheFileContent content;
        (void)read_cache_file_meta(path, &content);
    } catch (const Error &) {
    }
    try {
        (void)load_cache_file(path, tiny_model(), 4);
    } catch (const Error &) {
    }
}

// Cache files of the tiny model as kvlab compress writes them: the full cache, SnapKV at
// ratio 0.5, Ada-KV (heads of different lengths), SnapKV over Q8_0 / Q4_0 rows, and SnapKV
// within 30% of the F16 bytes demoting to Q4_0 (the demoted runs' sections); each as is (first
// byte 0) and for the forging mode (first byte 1).
void seeds(const std::string & dir) {
    const Model & model = tiny_model();
    const Tokenizer tok(model.path());
    Engine engine(model);
    std::string text = "The code is 7431.";
    for (const char * s :
         {" The sky was clear over the harbour that morning, and the boats left early.",
          " By noon the wind had turned, and the fishermen came back with half their nets empty.",
          " Nobody on the quay could remember a summer so dry; the wells were low and the fields pale.",
          " In the evening the lamps were lit one by one along the water, and the town grew quiet."})
        text += s;
    const std::vector<int32_t> tokens = tok.encode(text, false);
    Budget mixed = Budget::from_bytes_ratio(0.3);
    mixed.set_demotion(GGML_TYPE_Q4_0, -1.0);
    struct Seed {
        const char *name, *method;
        CacheTypes types;
        Budget budget;
    };
    const std::vector<Seed> list = {
        {"none", "none", {}, {}},
        {"snapkv", "snapkv", {}, Budget::from_ratio(0.5)},
        {"adakv", "adakv", {}, Budget::from_ratio(0.5)},
        {"snapkv-q8_0-q4_0", "snapkv", {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0}, Budget::from_ratio(0.5)},
        {"snapkv-mixed", "snapkv", {}, mixed},
    };
    int i = 0;
    for (const Seed & seed : list) {
        const std::string method = seed.method;
        std::vector<MethodRequest> methods;
        if (method != "none") methods.push_back({method, {}});
        ContextSession session(engine, methods, SessionOptions{0, 0, &tok, seed.types});
        session.prefill(tokens);
        PreparedCache p = methods.empty() ? session.full() : session.compress(0, seed.budget);
        const std::string path = dir + "/.tmp.kvc";
        std::filesystem::create_directories(dir);
        save_cache_file(path, model, p.cache, CacheFileContent{text, tokens, {{"method", method}}});
        const std::string bytes = read_file(path);
        std::filesystem::remove(path);
        for (char mode : {'\0', '\1'}) write_seed(dir, std::to_string(i++) + "-" + seed.name + ".kvc", mode + bytes);
    }
}

const FuzzRegistrar reg({"cache_file", [] { (void)tiny_model(); }, one, seeds});

}  // namespace
}  // namespace kvlab::fuzz
