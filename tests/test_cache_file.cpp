// Cache files: a saved and reloaded cache gives bit-identical rows, positions and logits
// (compressed with per-head lengths, and full); truncated, corrupt, tampered, foreign-model
// and future-version files are refused with a clear error; a writer killed with SIGKILL in
// the middle of a write leaves the previous file intact; `kvlab ask --cache` answers as the
// in-memory flow of `kvlab ask` does on the real default model.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kvlab/cache_file.h"
#include "kvlab/error.h"
#include "kvlab/session.h"
#include "kvlab/sys.h"
#include "support/fixtures.h"
#include "support/tiny_gguf.h"

extern char ** environ;

namespace kvlab {
namespace {

namespace fs = std::filesystem;
constexpr int64_t k_L = 100;

std::vector<uint8_t> slurp(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void spit(const std::string & path, const std::vector<uint8_t> & b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
}

// The message of the kvlab::Error that loading `path` throws ("" when it loads).
std::string load_error(const std::string & path, const Model & model) {
    try {
        load_cache_file(path, model, 4);
    } catch (const Error & e) {
        return e.what();
    }
    return "";
}

// Section table entry i of a cache file: offset and size (layout in cache_file.h).
struct Entry {
    std::string id;
    uint64_t offset, size;
};
std::vector<Entry> entries(const std::vector<uint8_t> & b) {
    uint32_t n;
    std::memcpy(&n, b.data() + 12, 4);
    std::vector<Entry> out;
    for (uint32_t i = 0; i < n; ++i) {
        const uint8_t * e = b.data() + 16 + 56 * i;
        Entry x{std::string(reinterpret_cast<const char *>(e), 4), 0, 0};
        std::memcpy(&x.offset, e + 8, 8);
        std::memcpy(&x.size, e + 16, 8);
        out.push_back(x);
    }
    return out;
}

void put_hex_sha(uint8_t * dst, const std::string & hex) {
    for (int i = 0; i < 32; ++i) dst[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
}

// Recomputes every checksum after a deliberate edit: a forger's file, whose checks pass.
void resign(std::vector<uint8_t> & b) {
    const auto es = entries(b);
    for (size_t i = 0; i < es.size(); ++i)
        put_hex_sha(b.data() + 16 + 56 * i + 24, sha256_hex(b.data() + es[i].offset, es[i].size));
    const size_t head = 16 + 56 * es.size();
    put_hex_sha(b.data() + head, sha256_hex(b.data(), head));
}

class CacheFile : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        test::TinySpec spec;
        spec.arch = "qwen2";
        spec.n_layer = 3;
        spec.n_head = 4;
        spec.n_head_kv = 2;
        spec.n_embd = 128;
        spec.head_dim = 32;  // whole Q8_0 / Q4_0 blocks
        spec.seed = 11;
        spec.n_ctx_train = 256;
        spec.weight_type = GGML_TYPE_Q8_0;
        tiny_ = test::load_tiny_model(spec, "cachefile", k_L + 8).release();
        spec.seed = 12;  // same shapes, other weights: another model
        other_ = test::load_tiny_model(spec, "cachefile-other", 8).release();
    }
    static void TearDownTestSuite() {
        delete tiny_;
        delete other_;
    }
    static const Model & model() { return *tiny_->model; }
    static std::vector<int32_t> context() { return {tiny_->tokens.begin(), tiny_->tokens.begin() + k_L}; }
    static std::vector<int32_t> query() { return {tiny_->tokens.begin() + k_L, tiny_->tokens.end()}; }
    // A file of the context compressed by adakv (per-head lengths) at `path`.
    static void write_adakv(const std::string & path) {
        Engine engine(model());
        ContextSession s(engine, {{"adakv", {}}}, SessionOptions{0, 0});
        s.prefill(context());
        const PreparedCache p = s.compress(0, Budget::from_ratio(0.5));
        save_cache_file(path, model(), p.cache, {"the text", context(), {{"method", "adakv"}}});
    }
    static inline test::TinyModel * tiny_ = nullptr;
    static inline test::TinyModel * other_ = nullptr;
};

TEST_F(CacheFile, ReloadedCachesAreBitIdentical) {
    const std::string dir = test::temp_dir("kvc-roundtrip");
    Engine engine(model());
    const SessionOptions so{int64_t(query().size()), 0};
    ContextSession s(engine, {{"adakv", {}}}, so);
    s.prefill(context());
    for (const bool compressed : {true, false}) {
        const PreparedCache p = compressed ? s.compress(0, Budget::from_ratio(0.6)) : s.full();
        if (compressed) {
            ASSERT_FALSE(p.cache.layer_uniform(0) && p.cache.layer_uniform(1) && p.cache.layer_uniform(2));
        }
        const std::string path = dir + "/c.kvc";
        const nlohmann::json info = {{"method", p.method}, {"note", "round trip"}};
        save_cache_file(path, model(), p.cache, {"some text", context(), info});
        const LoadedCacheFile f = load_cache_file(path, model(), s.reserve());
        EXPECT_EQ(f.content.tokens, context());
        EXPECT_EQ(f.content.text, "some text");
        EXPECT_EQ(f.content.context, info);
        EXPECT_EQ(f.meta["rows"].get<int64_t>(), p.cache.total_rows());
        EXPECT_EQ(f.cache.bytes(), p.cache.bytes());  // the same reserve: the same allocation
        ASSERT_EQ(f.cache.next_pos(), p.cache.next_pos());
        for (int il = 0; il < p.cache.n_layer(); ++il)
            for (int h = 0; h < p.cache.n_head_kv(); ++h) {
                EXPECT_EQ(f.cache.positions(il, h), p.cache.positions(il, h));
                EXPECT_EQ(f.cache.read_k(il, h), p.cache.read_k(il, h));
                EXPECT_EQ(f.cache.read_v(il, h), p.cache.read_v(il, h));
            }
        const std::vector<int32_t> answer = {5, 9, 13};
        EXPECT_EQ(s.teacher_forced(f.cache, query(), answer), s.teacher_forced(p.cache, query(), answer))
            << (compressed ? "compressed" : "full");
        const nlohmann::json meta = read_cache_file_meta(path);
        EXPECT_EQ(meta["context"], info);
        EXPECT_EQ(meta["next_pos"].get<int64_t>(), k_L);
    }
    fs::remove_all(dir);
}

// A shared store's entries (kvlab serve --store redis://): the same format in memory, the same
// rows back, and the same checks by the entry's name.
TEST_F(CacheFile, InMemoryBytesAreTheFileFormat) {
    const std::string dir = test::temp_dir("kvc-memory");
    Engine engine(model());
    ContextSession s(engine, {{"adakv", {}}}, SessionOptions{0, 0});
    s.prefill(context());
    const PreparedCache p = s.compress(0, Budget::from_ratio(0.5));
    const CacheFileContent content{"the text", context(), {{"method", "adakv"}}};
    const std::string bytes = encode_cache_file(model(), p.cache, content);
    const std::string path = dir + "/c.kvc";
    const uint64_t n = save_cache_file(path, model(), p.cache, content);
    EXPECT_EQ(bytes.size(), n);  // the file's sections at the same offsets (META's time may differ)
    spit(path, std::vector<uint8_t>(bytes.begin(), bytes.end()));  // the bytes are a file that loads
    const LoadedCacheFile f = load_cache_file(path, model(), 0);
    const LoadedCacheFile m =
        decode_cache_file("entry", reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), model(), 0);
    for (const LoadedCacheFile * x : {&f, &m}) {
        EXPECT_EQ(x->content.tokens, context());
        EXPECT_EQ(x->content.text, "the text");
        EXPECT_EQ(x->content.context, content.context);
        for (int il = 0; il < p.cache.n_layer(); ++il)
            for (int h = 0; h < p.cache.n_head_kv(); ++h) {
                EXPECT_EQ(x->cache.positions(il, h), p.cache.positions(il, h));
                EXPECT_EQ(x->cache.read_k(il, h), p.cache.read_k(il, h));
                EXPECT_EQ(x->cache.read_v(il, h), p.cache.read_v(il, h));
            }
    }
    const auto refused = [&](std::string b, const Model & mod) {
        try {
            decode_cache_file("redis entry X", reinterpret_cast<const uint8_t *>(b.data()), b.size(), mod, 0);
        } catch (const Error & e) {
            return std::string(e.what());
        }
        return std::string();
    };
    std::string bad = bytes;
    bad[bad.size() / 2] = char(bad[bad.size() / 2] ^ 0x5a);
    EXPECT_NE(refused(bad, model()).find("redis entry X: checksum mismatch"), std::string::npos) << refused(bad, model());
    EXPECT_NE(refused(bytes.substr(0, bytes.size() / 3), model()).find("redis entry X: truncated"), std::string::npos);
    EXPECT_NE(refused(bytes, *other_->model).find("redis entry X: was made with model"), std::string::npos);
    fs::remove_all(dir);
}

TEST_F(CacheFile, DamagedFilesAreRefusedByName) {
    const std::string dir = test::temp_dir("kvc-damage");
    const std::string good = dir + "/good.kvc", bad = dir + "/bad.kvc";
    write_adakv(good);
    ASSERT_EQ(load_error(good, model()), "");
    const std::vector<uint8_t> bytes = slurp(good);
    const auto es = entries(bytes);
    ASSERT_EQ(es.size(), 5u);

    // truncated anywhere: in the magic, in the header, in every section, one byte short
    std::vector<size_t> cuts = {0, 5, 20, 200, bytes.size() - 1};
    for (const Entry & e : es) cuts.push_back(size_t(e.offset + e.size / 2));
    for (size_t cut : cuts) {
        spit(bad, {bytes.begin(), bytes.begin() + long(cut)});
        const std::string err = load_error(bad, model());
        EXPECT_NE(err.find("[cache-file] " + bad + ":"), std::string::npos) << cut << ": " << err;
        EXPECT_TRUE(err.find("truncated") != std::string::npos || err.find("too short") != std::string::npos ||
                    err.find("checksum") != std::string::npos)
            << cut << ": " << err;
    }
    // one flipped bit in every section, and in the section table
    for (const Entry & e : es) {
        if (e.size == 0) continue;
        std::vector<uint8_t> b = bytes;
        b[e.offset + e.size / 3] ^= 0x10;
        spit(bad, b);
        EXPECT_NE(load_error(bad, model()).find("checksum mismatch in section " + e.id), std::string::npos) << e.id;
    }
    std::vector<uint8_t> b = bytes;
    b[16 + 8] ^= 1;  // the first section's offset
    spit(bad, b);
    EXPECT_NE(load_error(bad, model()).find("header checksum mismatch"), std::string::npos);
    // not a cache file at all; a newer format
    spit(bad, std::vector<uint8_t>(400, 'x'));
    EXPECT_NE(load_error(bad, model()).find("not a kvlab cache file"), std::string::npos);
    b = bytes;
    b[8] = uint8_t(k_cache_file_version + 1);
    spit(bad, b);
    EXPECT_NE(load_error(bad, model())
                  .find("made by a newer kvlab (cache format version " + std::to_string(k_cache_file_version + 1)),
              std::string::npos);
    // tampered and re-signed: positions out of order, a token outside the vocabulary, rows
    // that do not add up, a META that is not JSON
    const auto section = [&](const std::string & id) {
        for (const Entry & e : es)
            if (e.id == id) return e;
        return Entry{};
    };
    b = bytes;
    const Entry segs = section("SEGS");
    int32_t p0, p1;
    std::memcpy(&p0, b.data() + segs.offset + 4, 4);
    std::memcpy(&p1, b.data() + segs.offset + 8, 4);
    std::memcpy(b.data() + segs.offset + 4, &p1, 4);
    std::memcpy(b.data() + segs.offset + 8, &p0, 4);
    resign(b);
    spit(bad, b);
    EXPECT_NE(load_error(bad, model()).find("corrupt SEGS section"), std::string::npos) << load_error(bad, model());
    b = bytes;
    const int32_t huge = 1 << 30;
    std::memcpy(b.data() + section("TOKN").offset, &huge, 4);
    resign(b);
    spit(bad, b);
    EXPECT_NE(load_error(bad, model()).find("corrupt TOKN section (token id"), std::string::npos);
    b = bytes;
    uint32_t rows;
    std::memcpy(&rows, b.data() + segs.offset, 4);
    rows += 1;
    std::memcpy(b.data() + segs.offset, &rows, 4);
    resign(b);
    spit(bad, b);
    EXPECT_NE(load_error(bad, model()).find("corrupt"), std::string::npos);
    b = bytes;
    b[section("META").offset] = '[';
    resign(b);
    spit(bad, b);
    EXPECT_NE(load_error(bad, model()).find("corrupt META section"), std::string::npos);
    // a file made with another model is refused by name, before any row is used
    const std::string err = load_error(good, *other_->model);
    EXPECT_NE(err.find("was made with model " + fs::path(model().path()).filename().string()), std::string::npos)
        << err;
    fs::remove_all(dir);
}

// Quantized rows (Q8_0 / Q4_0, K and V of different types) are saved as stored and reload
// to the same bytes and the same logits; the file says its types.
TEST_F(CacheFile, QuantizedCachesRoundTrip) {
    const std::string dir = test::temp_dir("kvc-quant");
    Engine engine(model());
    for (const CacheTypes types :
         {CacheTypes{GGML_TYPE_Q8_0, GGML_TYPE_Q8_0}, CacheTypes{GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}}) {
        SCOPED_TRACE(std::string("K ") + cache_type_name(types.k) + ", V " + cache_type_name(types.v));
        SessionOptions so{int64_t(query().size()), 0};
        so.cache_types = types;
        ContextSession s(engine, {{"adakv", {}}}, so);
        s.prefill(context());
        const PreparedCache p = s.compress(0, Budget::from_ratio(0.5));
        ASSERT_EQ(p.cache.types(), types);
        const std::string path = dir + "/q.kvc";
        save_cache_file(path, model(), p.cache, {"text", context(), {}});
        const LoadedCacheFile f = load_cache_file(path, model(), s.reserve());
        EXPECT_EQ(f.cache.types(), types);
        EXPECT_EQ(f.meta["cache_types"]["k"], cache_type_name(types.k));
        EXPECT_EQ(f.meta["kv_bytes"].get<uint64_t>(), p.cache.used_bytes());
        EXPECT_EQ(f.cache.bytes(), p.cache.bytes());
        for (int il = 0; il < p.cache.n_layer(); ++il)
            for (int h = 0; h < p.cache.n_head_kv(); ++h)
                for (bool value : {false, true}) {
                    const size_t n =
                        size_t(p.cache.n_rows(il, h)) * (value ? p.cache.v_row_bytes() : p.cache.k_row_bytes());
                    std::vector<uint8_t> a(n), b(n);
                    p.cache.read_rows(il, h, value, a.data());
                    f.cache.read_rows(il, h, value, b.data());
                    EXPECT_EQ(a, b) << "layer " << il << " head " << h;
                }
        const std::vector<int32_t> answer = {5, 9, 13};
        EXPECT_EQ(s.teacher_forced(f.cache, query(), answer), s.teacher_forced(p.cache, query(), answer));
        // a META that names other types than the rows were written in: the sizes disagree
        std::vector<uint8_t> b = slurp(path);
        const auto es = entries(b);
        for (const Entry & e : es)
            if (e.id == "META") {
                std::string meta(reinterpret_cast<const char *>(b.data() + e.offset), e.size);
                const std::string from = std::string("\"v\":\"") + cache_type_name(types.v) + "\"";
                const size_t at = meta.find(from);
                ASSERT_NE(at, std::string::npos) << meta;
                meta.replace(at, from.size(), "\"v\":\"f16\"");  // same length: q8_0 -> f16 + a space
                meta.resize(e.size, ' ');
                std::memcpy(b.data() + e.offset, meta.data(), e.size);
            }
        resign(b);
        spit(dir + "/bad.kvc", b);
        EXPECT_NE(load_error(dir + "/bad.kvc", model()).find("corrupt ROWS section"), std::string::npos)
            << load_error(dir + "/bad.kvc", model());
    }
    fs::remove_all(dir);
}

// A version-1 file (F16 rows in a KVF6 section, no cache_types) still loads: made here from a
// version-2 file of F16 rows by writing the old version number and section name.
// Mixed precision (version 3): the demoted run of every segment (LSEG, LROW) round-trips with
// its positions and bytes; a META whose demoted type disagrees with the rows, or that drops it,
// is refused by name.
TEST_F(CacheFile, MixedCachesRoundTrip) {
    const std::string dir = test::temp_dir("kvc-mixed");
    Engine engine(model());
    ContextSession s(engine, {{"knorm", {}}}, SessionOptions{int64_t(query().size()), 0});
    s.prefill(context());
    Budget b = Budget::from_bytes_ratio(0.35);
    b.set_demotion(GGML_TYPE_Q4_0, -1.0);
    const PreparedCache p = s.compress(0, b);
    ASSERT_GT(p.cache.total_low_rows(), 0);
    ASSERT_GT(p.cache.total_rows(), p.cache.total_low_rows());
    const std::string path = dir + "/m.kvc";
    save_cache_file(path, model(), p.cache, {"text", context(), {}});
    const LoadedCacheFile f = load_cache_file(path, model(), s.reserve());
    EXPECT_EQ(f.cache.types(), p.cache.types());
    EXPECT_EQ(f.meta["cache_types"]["low"], "q4_0");
    EXPECT_EQ(f.meta["rows_demoted"].get<int64_t>(), p.cache.total_low_rows());
    EXPECT_EQ(f.meta["kv_bytes"].get<uint64_t>(), p.cache.used_bytes());
    for (int il = 0; il < p.cache.n_layer(); ++il)
        for (int h = 0; h < p.cache.n_head_kv(); ++h) {
            EXPECT_EQ(f.cache.positions(il, h), p.cache.positions(il, h));
            EXPECT_EQ(f.cache.low_positions(il, h), p.cache.low_positions(il, h));
            for (bool value : {false, true}) {
                const size_t n = size_t(p.cache.n_low(il, h)) * p.cache.low_row_bytes();
                std::vector<uint8_t> x(n), y(n);
                p.cache.read_rows(il, h, value, x.data(), true);
                f.cache.read_rows(il, h, value, y.data(), true);
                EXPECT_EQ(x, y) << "demoted rows of layer " << il << " head " << h;
                EXPECT_EQ(f.cache.read_k(il, h), p.cache.read_k(il, h));
            }
        }
    const std::vector<int32_t> answer = {5, 9, 13};
    EXPECT_EQ(s.teacher_forced(f.cache, query(), answer), s.teacher_forced(p.cache, query(), answer));
    const auto edit_meta = [&](const std::string & from, const std::string & to) {
        std::vector<uint8_t> bytes = slurp(path);
        for (const Entry & e : entries(bytes))
            if (e.id == "META") {
                std::string meta(reinterpret_cast<const char *>(bytes.data() + e.offset), e.size);
                const size_t at = meta.find(from);
                EXPECT_NE(at, std::string::npos) << meta;
                meta.replace(at, from.size(), to);
                meta.resize(e.size, ' ');
                std::memcpy(bytes.data() + e.offset, meta.data(), e.size);
            }
        resign(bytes);
        spit(dir + "/bad.kvc", bytes);
        return load_error(dir + "/bad.kvc", model());
    };
    std::string e = edit_meta("\"low\":\"q4_0\"", "\"low\":\"q8_0\"");
    EXPECT_NE(e.find("corrupt LROW section"), std::string::npos) << e;
    e = edit_meta(",\"low\":\"q4_0\"", "");
    EXPECT_NE(e.find("demoted rows' sections"), std::string::npos) << e;
    fs::remove_all(dir);
}

TEST_F(CacheFile, VersionOneFilesStillLoad) {
    const std::string dir = test::temp_dir("kvc-v1");
    const std::string v2 = dir + "/v2.kvc", v1 = dir + "/v1.kvc";
    write_adakv(v2);
    std::vector<uint8_t> b = slurp(v2);
    uint32_t version = 0;
    std::memcpy(&version, b.data() + 8, 4);
    ASSERT_EQ(version, k_cache_file_version);
    version = 1;
    std::memcpy(b.data() + 8, &version, 4);
    const auto es = entries(b);
    bool renamed = false;
    for (size_t i = 0; i < es.size(); ++i)
        if (es[i].id == "ROWS") {
            std::memcpy(b.data() + 16 + 56 * i, "KVF6", 4);
            renamed = true;
        }
    ASSERT_TRUE(renamed);
    resign(b);
    spit(v1, b);
    const LoadedCacheFile a = load_cache_file(v2, model(), 4), o = load_cache_file(v1, model(), 4);
    EXPECT_EQ(o.cache.types(), CacheTypes{});
    for (int il = 0; il < a.cache.n_layer(); ++il)
        for (int h = 0; h < a.cache.n_head_kv(); ++h) {
            EXPECT_EQ(o.cache.positions(il, h), a.cache.positions(il, h));
            EXPECT_EQ(o.cache.read_k(il, h), a.cache.read_k(il, h));
            EXPECT_EQ(o.cache.read_v(il, h), a.cache.read_v(il, h));
        }
    // a version-2 file without its ROWS section is refused by name
    version = 2;
    std::memcpy(b.data() + 8, &version, 4);
    resign(b);
    spit(v1, b);
    EXPECT_NE(load_error(v1, model()).find("no ROWS section"), std::string::npos) << load_error(v1, model());
    fs::remove_all(dir);
}

// Starts `argv` as a child process and returns its pid.
pid_t spawn(const std::vector<std::string> & args) {
    std::vector<char *> argv;
    for (const auto & a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

int wait_exit(pid_t pid) {
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The real default model, the real CLI: a first file is written; a second `kvlab compress`
// of the same path is killed with SIGKILL as soon as its temporary file appears (while it
// writes tens of MB and fsyncs them); the first file is still there, byte for byte, and
// loads. Then `kvlab ask --cache` answers exactly as `kvlab ask` does in memory.
TEST(CacheFileCli, KilledWriterLeavesThePreviousFileAndAskAnswersFromIt) {
    const std::string model = test::default_model_path();
    const std::string dir = test::temp_dir("kvc-cli");
    const std::string doc = dir + "/doc.txt", kvc = dir + "/doc.kvc";
    {
        std::ofstream out(doc);
        out << test::test_text("avg.txt").substr(0, 2400) << "\nThe secret code is 7431.\n";
    }
    const std::string bin = test::kvlab_binary();
    const auto q = test::run_command(bin + " compress " + model + " --context-file " + doc +
                                     " --method snapkv --ratio 0.5 -t 2 -o " + kvc);
    ASSERT_EQ(q.exit_code, 0) << q.output;
    const std::vector<uint8_t> first = slurp(kvc);

    // the full cache of a longer context: a write of ~45 MB
    const std::string long_doc = dir + "/long.txt";
    {
        std::ofstream out(long_doc);
        out << test::test_text("avg.txt").substr(0, 8000);
    }
    const pid_t pid = spawn({bin, "compress", model, "--context-file", long_doc, "-t", "2", "-o", kvc});
    ASSERT_GT(pid, 0);
    bool seen = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!seen && std::chrono::steady_clock::now() < deadline) {
        for (const auto & e : fs::directory_iterator(dir))
            if (e.path().filename().string().rfind("doc.kvc.tmp-", 0) == 0) seen = true;
        if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    kill(pid, SIGKILL);
    EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
    ASSERT_TRUE(seen) << "the writer never created its temporary file";
    EXPECT_EQ(slurp(kvc), first) << "the previous file changed";

    // a write that hits a file-size limit (a full disk, as far as the writer can tell): a clear
    // error, the previous file intact, no temporary file left
    const auto full = test::run_command("bash -c 'ulimit -f 2000; " + bin + " compress " + model + " --context-file " +
                                        long_doc + " -t 2 -o " + kvc + "'");
    EXPECT_EQ(full.exit_code, 1) << full.output;
    EXPECT_NE(full.output.find("[cache-file] " + kvc + ": write failed: File too large"), std::string::npos)
        << full.output;
    EXPECT_EQ(slurp(kvc), first);
    for (const auto & e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind("doc.kvc.tmp-", 0) == 0 &&
            e.path().filename().string().find(std::to_string(pid)) == std::string::npos)
            ADD_FAILURE() << "left behind: " << e.path();

    // answers from the file equal the in-memory flow's
    const std::string qs = " -q 'What is the secret code?' -q 'What is the text about?' -n 12 -t 2 --json";
    const auto from_file = test::run_command(bin + " ask " + model + " --cache " + kvc + qs + " 2>/dev/null");
    const auto in_memory = test::run_command(bin + " ask " + model + " --context-file " + doc +
                                             " --method snapkv --ratio 0.5" + qs + " 2>/dev/null");
    ASSERT_EQ(from_file.exit_code, 0) << from_file.output;
    ASSERT_EQ(in_memory.exit_code, 0) << in_memory.output;
    const auto a = nlohmann::json::parse(from_file.output), b = nlohmann::json::parse(in_memory.output);
    ASSERT_EQ(a["answers"].size(), 2u);
    for (int i = 0; i < 2; ++i) EXPECT_EQ(a["answers"][i]["tokens"], b["answers"][i]["tokens"]) << i;
    EXPECT_NE(a["answers"][0]["answer"].get<std::string>().find("7431"), std::string::npos)
        << a["answers"][0]["answer"];
    fs::remove_all(dir);
}

}  // namespace
}  // namespace kvlab
