#include "kvlab/cache_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>

#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab {

static_assert(std::endian::native == std::endian::little, "cache files are little-endian");

namespace {

constexpr char k_magic[8] = {'K', 'V', 'L', 'A', 'B', 'K', 'V', 'C'};
constexpr size_t k_fixed = 16;  // magic, version, n_sections
constexpr size_t k_entry = 56;  // id, flags, offset, size, sha256
constexpr size_t k_sha = 32;
constexpr uint32_t k_max_sections = 16;
constexpr uint64_t k_align = 64;
const std::array<std::string, 4> k_sections = {"META", "TEXT", "TOKN", "SEGS"};
// The rows' section: F16 rows in version 1, rows of META's cache_types from version 2 on.
std::string rows_section(uint32_t version) {
    return version >= 2 ? "ROWS" : "KVF6";
}

Error file_error(const std::string & path, const std::string & what) {
    return Error("cache-file", path + ": " + what);
}

std::string hex_of(const uint8_t * sha) {
    static const char * digits = "0123456789abcdef";
    std::string s(2 * k_sha, '0');
    for (size_t i = 0; i < k_sha; ++i) {
        s[2 * i] = digits[sha[i] >> 4];
        s[2 * i + 1] = digits[sha[i] & 15];
    }
    return s;
}

void bytes_of_hex(const std::string & hex, uint8_t * out) {
    for (size_t i = 0; i < k_sha; ++i) out[i] = uint8_t(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
}

uint64_t align_up(uint64_t x) {
    return (x + k_align - 1) / k_align * k_align;
}

template <typename T>
void put(std::vector<uint8_t> & b, T v) {
    const size_t at = b.size();
    b.resize(at + sizeof(T));
    std::memcpy(b.data() + at, &v, sizeof(T));
}

template <typename T>
T get(const uint8_t * p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

// A file descriptor that closes itself.
struct Fd {
    int fd = -1;
    explicit Fd(int f) : fd(f) {}
    Fd(const Fd &) = delete;
    Fd & operator=(const Fd &) = delete;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

void write_all(int fd, const void * data, size_t n, uint64_t offset, const std::string & path) {
    const auto * p = static_cast<const uint8_t *>(data);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, off_t(offset));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw file_error(path, std::string("write failed: ") + std::strerror(errno));
        p += w;
        n -= size_t(w);
        offset += uint64_t(w);
    }
}

void read_all(int fd, void * data, size_t n, uint64_t offset, const std::string & path) {
    auto * p = static_cast<uint8_t *>(data);
    while (n > 0) {
        const ssize_t r = ::pread(fd, p, n, off_t(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw file_error(path, std::string("read failed: ") + std::strerror(errno));
        if (r == 0) throw file_error(path, "truncated (the file ended while it was read)");
        p += r;
        n -= size_t(r);
        offset += uint64_t(r);
    }
}

struct Section {
    std::string id;
    uint64_t offset = 0, size = 0;
    std::string sha;  // hex
};

// The section table of a file's first bytes; checks the magic, the version and the header
// checksum. `head` holds at least the fixed part; `need` is set to the header's full size.
std::map<std::string, Section> parse_header(const std::string & path, const uint8_t * head, size_t n_head,
                                            uint64_t file_size, size_t * need, uint32_t * version_out = nullptr) {
    if (file_size < k_fixed + k_sha || n_head < k_fixed) throw file_error(path, "not a kvlab cache file (too short)");
    if (std::memcmp(head, k_magic, sizeof(k_magic)) != 0) throw file_error(path, "not a kvlab cache file (bad magic)");
    const uint32_t version = get<uint32_t>(head + 8);
    if (version > k_cache_file_version)
        throw file_error(path, "made by a newer kvlab (cache format version " + std::to_string(version) +
                                   "; this kvlab reads version " + std::to_string(k_cache_file_version) + ")");
    if (version == 0) throw file_error(path, "corrupt header (format version 0)");
    if (version_out) *version_out = version;
    const uint32_t n = get<uint32_t>(head + 12);
    if (n == 0 || n > k_max_sections) throw file_error(path, "corrupt header (" + std::to_string(n) + " sections)");
    *need = k_fixed + n * k_entry + k_sha;
    if (file_size < *need) throw file_error(path, "truncated inside its header");
    if (n_head < *need) return {};
    const std::string want = hex_of(head + k_fixed + n * k_entry);
    if (sha256_hex(head, k_fixed + n * k_entry) != want)
        throw file_error(path, "header checksum mismatch (the file is corrupt or was altered)");
    std::map<std::string, Section> out;
    for (uint32_t i = 0; i < n; ++i) {
        const uint8_t * e = head + k_fixed + i * k_entry;
        Section s{std::string(reinterpret_cast<const char *>(e), 4), get<uint64_t>(e + 8), get<uint64_t>(e + 16),
                  hex_of(e + 24)};
        if (s.offset < *need || s.offset > file_size || s.size > file_size - s.offset)
            throw file_error(path, "truncated: section " + s.id + " ends past the end of the file");
        if (!out.emplace(s.id, s).second) throw file_error(path, "corrupt header (section " + s.id + " twice)");
    }
    for (const std::string & id : k_sections)
        if (!out.count(id)) throw file_error(path, "corrupt header (no " + id + " section)");
    if (!out.count(rows_section(version)))
        throw file_error(path, "corrupt header (no " + rows_section(version) + " section)");
    return out;
}

void check_section(const std::string & path, const Section & s, const uint8_t * data) {
    if (sha256_hex(data, s.size) != s.sha)
        throw file_error(path, "checksum mismatch in section " + s.id + " (the file is corrupt or was altered)");
}

nlohmann::json parse_meta(const std::string & path, const uint8_t * data, uint64_t size) {
    nlohmann::json meta = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object() || !meta.contains("model") || !meta["model"].is_object() || !meta.contains("next_pos") ||
        !meta["next_pos"].is_number_integer())
        throw file_error(path, "corrupt META section");
    return meta;
}

std::string string_field(const nlohmann::json & j, const char * key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// META's cache_types {k, v} (version 2 on).
CacheTypes read_cache_types(const std::string & path, const nlohmann::json & meta) {
    const nlohmann::json & t = meta.contains("cache_types") ? meta["cache_types"] : nlohmann::json();
    if (!t.is_object() || !t.contains("rotate") || !t["rotate"].is_boolean())
        throw file_error(path, "corrupt META section (no cache_types {k, v, rotate})");
    try {
        CacheTypes c{parse_cache_type(string_field(t, "k")), parse_cache_type(string_field(t, "v")),
                     t["rotate"].get<bool>()};
        if (t.contains("low")) c.low = parse_cache_type(string_field(t, "low"));
        return c;
    } catch (const Error & e) {
        throw file_error(path, std::string("corrupt META section: ") + e.what());
    }
}

// The context's text, tokens and the caller's object from META and the (verified) TEXT and
// TOKN sections; with n_vocab > 0 every token id is checked against the vocabulary too.
CacheFileContent read_content(const std::string & path, const nlohmann::json & meta, const uint8_t * text,
                              uint64_t n_text, const uint8_t * tokn, uint64_t n_tokn, int32_t n_vocab) {
    const int64_t next_pos = meta["next_pos"].get<int64_t>();
    if (next_pos < 1 || n_tokn != uint64_t(next_pos) * sizeof(int32_t))
        throw file_error(path, "corrupt TOKN section (" + std::to_string(n_tokn) + " bytes for " +
                                   std::to_string(next_pos) + " tokens)");
    CacheFileContent c;
    c.tokens.resize(size_t(next_pos));
    std::memcpy(c.tokens.data(), tokn, n_tokn);
    if (n_vocab > 0)
        for (int32_t t : c.tokens)
            if (t < 0 || t >= n_vocab)
                throw file_error(path, "corrupt TOKN section (token id " + std::to_string(t) + ")");
    c.text.assign(reinterpret_cast<const char *>(text), n_text);
    if (meta.contains("context") && meta["context"].is_object()) c.context = meta["context"];
    return c;
}

}  // namespace

nlohmann::json before_json(const std::vector<ChatMessage> & before) {
    nlohmann::json j = nlohmann::json::array();
    for (const ChatMessage & m : before) j.push_back({{"role", m.role}, {"content", m.content}});
    return j;
}

std::vector<ChatMessage> context_before(const nlohmann::json & context) {
    std::vector<ChatMessage> out;
    if (context.is_object() && context.contains("before") && context["before"].is_array())
        for (const auto & m : context["before"])
            if (m.is_object()) out.push_back({m.value("role", ""), m.value("content", "")});
    return out;
}

namespace {

// SEGS (or LSEG, low: the demoted runs): per layer, per KV head, u32 n then i32 [n] positions.
std::vector<uint8_t> segments_bytes(const KvStore & cache, bool low) {
    std::vector<uint8_t> segs;
    for (int il = 0; il < cache.n_layer(); ++il)
        for (int h = 0; h < cache.n_head_kv(); ++h) {
            const auto & pos = low ? cache.low_positions(il, h) : cache.positions(il, h);
            put<uint32_t>(segs, uint32_t(pos.size()));
            for (int32_t p : pos) put<int32_t>(segs, p);
        }
    return segs;
}

SegmentPositions parse_segments(const std::string & path, const std::string & id, const uint8_t * p, uint64_t size,
                                const HParams & hp, int64_t next_pos, uint64_t * total) {
    SegmentPositions positions(size_t(hp.n_layer), std::vector<std::vector<int32_t>>(size_t(hp.n_head_kv)));
    const uint8_t * const end = p + size;
    for (auto & layer : positions)
        for (auto & pos : layer) {
            if (end - p < 4) throw file_error(path, "corrupt " + id + " section (too short)");
            const uint32_t n = get<uint32_t>(p);
            p += 4;
            if (n > uint64_t(next_pos) || uint64_t(end - p) < uint64_t(n) * 4)
                throw file_error(path, "corrupt " + id + " section (a segment of " + std::to_string(n) + " rows)");
            pos.resize(n);
            if (n > 0) std::memcpy(pos.data(), p, size_t(n) * 4);  // an empty segment has no data() to copy to
            p += size_t(n) * 4;
            *total += n;
        }
    if (p != end) throw file_error(path, "corrupt " + id + " section (trailing bytes)");
    return positions;
}

// Lays the file out through write(offset, data, n) (positions may come in any order; every byte
// up to the returned size is written once). `name` only labels errors.
uint64_t write_cache_bytes(const std::string & name, const Model & model, const KvStore & cache,
                           const CacheFileContent & content,
                           const std::function<void(uint64_t, const void *, size_t)> & write) {
    namespace fs = std::filesystem;
    const HParams & hp = model.hparams();
    const std::string & path = name;
    if (int64_t(content.tokens.size()) != cache.next_pos())
        throw file_error(path, "the store holds " + std::to_string(cache.next_pos()) + " positions but " +
                                   std::to_string(content.tokens.size()) + " context tokens were given");
    nlohmann::json meta = {
        {"format", {{"name", "kvlab-kvc"}, {"version", k_cache_file_version}}},
        {"model",
         {{"file", fs::path(model.path()).filename().string()},
          {"sha256", model.file_sha256()},
          {"hparams_hash", hparams_hash(model)},
          {"hparams", hparams_json(model)}}},
        {"next_pos", cache.next_pos()},
        {"rows", cache.total_rows()},
        {"kv_bytes", cache.used_bytes()},
        {"cache_types",
         {{"k", cache_type_name(cache.types().k)},
          {"v", cache_type_name(cache.types().v)},
          {"rotate", cache.types().rotate}}},
        {"rows_demoted", cache.total_low_rows()},
        {"created_unix", int64_t(std::time(nullptr))},
        {"kvlab", {{"version", kvlab_version()}, {"commit", kvlab_git_commit()}}},
        {"context", content.context},
    };
    const bool mixed = cache.types().mixed();
    if (mixed) meta["cache_types"]["low"] = cache_type_name(cache.types().low);
    const std::string meta_text = meta.dump(
        -1, ' ', false, nlohmann::json::error_handler_t::replace);  // text that is not UTF-8 is replaced, never fatal
    const std::vector<uint8_t> segs = segments_bytes(cache, false);

    const size_t n_sec = k_sections.size() + (mixed ? 3 : 1);
    const uint64_t header = k_fixed + n_sec * k_entry + k_sha;
    std::vector<Section> table;
    uint64_t at = align_up(header);
    const auto write_section = [&](const std::string & id, const void * data, size_t n) {
        write(at, data, n);
        table.push_back({id, at, n, sha256_hex(data, n)});
        at = align_up(at + n);
    };
    write_section("META", meta_text.data(), meta_text.size());
    write_section("TEXT", content.text.data(), content.text.size());
    write_section("TOKN", content.tokens.data(), content.tokens.size() * sizeof(int32_t));
    write_section("SEGS", segs.data(), segs.size());
    // the rows, streamed segment by segment with a running checksum
    const auto write_rows = [&](const std::string & id, bool low) {
        Sha256 sha;
        const uint64_t start = at;
        std::vector<uint8_t> rows;
        for (int il = 0; il < hp.n_layer; ++il)
            for (int h = 0; h < hp.n_head_kv; ++h)
                for (bool value : {false, true}) {
                    rows.resize(low ? size_t(cache.n_low(il, h)) * cache.low_row_bytes()
                                    : size_t(cache.n_rows(il, h)) *
                                          (value ? cache.v_row_bytes() : cache.k_row_bytes()));
                    cache.read_rows(il, h, value, rows.data(), low);
                    write(at, rows.data(), rows.size());
                    sha.update(rows.data(), rows.size());
                    at += rows.size();
                }
        table.push_back({id, start, at - start, sha.hex()});
        at = align_up(at);
    };
    write_rows(rows_section(k_cache_file_version), false);
    if (mixed) {
        const std::vector<uint8_t> low_segs = segments_bytes(cache, true);
        write_section("LSEG", low_segs.data(), low_segs.size());
        write_rows("LROW", true);
    }
    std::vector<uint8_t> head(k_magic, k_magic + sizeof(k_magic));
    put<uint32_t>(head, k_cache_file_version);
    put<uint32_t>(head, uint32_t(n_sec));
    for (const Section & s : table) {
        head.insert(head.end(), s.id.begin(), s.id.end());
        put<uint32_t>(head, 0);
        put<uint64_t>(head, s.offset);
        put<uint64_t>(head, s.size);
        head.resize(head.size() + k_sha);
        bytes_of_hex(s.sha, head.data() + head.size() - k_sha);
    }
    const std::string hsha = sha256_hex(head.data(), head.size());
    head.resize(head.size() + k_sha);
    bytes_of_hex(hsha, head.data() + head.size() - k_sha);
    write(0, head.data(), head.size());

    return at;
}

}  // namespace

uint64_t save_cache_file(const std::string & path, const Model & model, const KvStore & cache,
                         const CacheFileContent & content) {
    namespace fs = std::filesystem;
    static std::atomic<uint64_t> counter{0};
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.fd < 0) throw file_error(path, "cannot create " + tmp + ": " + std::strerror(errno));
    bool done = false;
    struct Cleanup {
        const std::string & tmp;
        const bool & done;
        ~Cleanup() {
            if (!done) ::unlink(tmp.c_str());
        }
    } cleanup{tmp, done};
    const uint64_t size = write_cache_bytes(path, model, cache, content, [&](uint64_t at, const void * data, size_t n) {
        write_all(fd.fd, data, n, at, path);
    });
    if (::fsync(fd.fd) != 0) throw file_error(path, std::string("fsync failed: ") + std::strerror(errno));
    if (::close(fd.fd) != 0) {
        fd.fd = -1;
        throw file_error(path, std::string("close failed: ") + std::strerror(errno));
    }
    fd.fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0)
        throw file_error(path, "cannot rename " + tmp + " over it: " + std::strerror(errno));
    done = true;
    const fs::path dir = fs::absolute(path).parent_path();
    Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd.fd >= 0) ::fsync(dfd.fd);  // the rename itself made durable (best effort)
    return size;
}

std::string encode_cache_file(const Model & model, const KvStore & cache, const CacheFileContent & content) {
    std::string out;
    const uint64_t size = write_cache_bytes("(in memory)", model, cache, content,
                                            [&out](uint64_t at, const void * data, size_t n) {
                                                if (out.size() < at + n) out.resize(size_t(at + n));
                                                std::memcpy(out.data() + at, data, n);
                                            });
    out.resize(size_t(size));  // the padding after the last section
    return out;
}

LoadedCacheFile load_cache_file(const std::string & path, const Model & model, int64_t reserve) {
    const double t0 = now_seconds();
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0) throw file_error(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw file_error(path, "not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    require_memory(size, "reading the cache file " + path);
    std::vector<uint8_t> buf(size);
    read_all(fd.fd, buf.data(), buf.size(), 0, path);
    LoadedCacheFile f = decode_cache_file(path, buf.data(), buf.size(), model, reserve);
    f.read_s = now_seconds() - t0 - f.verify_s - f.build_s;
    return f;
}

LoadedCacheFile decode_cache_file(const std::string & path, const uint8_t * buf_data, size_t size,
                                  const Model & model, int64_t reserve) {
    const HParams & hp = model.hparams();
    double t0 = now_seconds();
    size_t need = 0;
    uint32_t version = 0;
    const auto secs = parse_header(path, buf_data, size, size, &need, &version);
    for (const auto & [id, s] : secs) check_section(path, s, buf_data + s.offset);
    const auto data = [&](const char * id) { return buf_data + secs.at(id).offset; };
    const auto bytes = [&](const char * id) { return secs.at(id).size; };
    nlohmann::json meta = parse_meta(path, data("META"), bytes("META"));
    const nlohmann::json & m = meta["model"];
    const std::string sha = model.file_sha256(), hh = hparams_hash(model);
    if (string_field(m, "sha256") != sha)
        throw file_error(path, "was made with model " + string_field(m, "file") + " (sha256 " +
                                   string_field(m, "sha256").substr(0, 12) + "...), not with " +
                                   std::filesystem::path(model.path()).filename().string() + " (sha256 " +
                                   sha.substr(0, 12) + "...)");
    if (string_field(m, "hparams_hash") != hh)
        throw file_error(path, "was made with other hyper-parameters than " + model.path() + "'s");
    const int64_t next_pos = meta["next_pos"].get<int64_t>();
    if (next_pos < 1 || next_pos > hp.n_ctx_train)
        throw file_error(path, "corrupt META (" + std::to_string(next_pos) + " positions)");
    CacheFileContent content =
        read_content(path, meta, data("TEXT"), bytes("TEXT"), data("TOKN"), bytes("TOKN"), hp.n_vocab);

    uint64_t total_rows = 0, total_low = 0;
    SegmentPositions positions = parse_segments(path, "SEGS", data("SEGS"), bytes("SEGS"), hp, next_pos, &total_rows);
    const CacheTypes types = version >= 2 ? read_cache_types(path, meta) : CacheTypes{};
    const uint64_t k_row = cache_row_bytes(types.k, hp.head_dim), v_row = cache_row_bytes(types.v, hp.head_dim);
    const std::string rows_id = rows_section(version);
    if (bytes(rows_id.c_str()) != total_rows * (k_row + v_row))
        throw file_error(path, "corrupt " + rows_id + " section (" + std::to_string(bytes(rows_id.c_str())) +
                                   " bytes for " + std::to_string(total_rows) + " rows of " + cache_type_name(types.k) +
                                   " K and " + cache_type_name(types.v) + " V)");
    SegmentPositions low_positions;
    const uint64_t low_row = types.mixed() ? cache_row_bytes(types.low, hp.head_dim) : 0;
    if (types.mixed() != (secs.count("LSEG") > 0) || types.mixed() != (secs.count("LROW") > 0))
        throw file_error(path, "corrupt header (demoted rows' sections LSEG and LROW " +
                                   std::string(types.mixed() ? "missing" : "without a demoted type in META") + ")");
    if (types.mixed()) {
        low_positions = parse_segments(path, "LSEG", data("LSEG"), bytes("LSEG"), hp, next_pos, &total_low);
        if (bytes("LROW") != total_low * 2 * low_row)
            throw file_error(path, "corrupt LROW section (" + std::to_string(bytes("LROW")) + " bytes for " +
                                       std::to_string(total_low) + " demoted rows of " + cache_type_name(types.low) +
                                       ")");
    }
    const double verify_s = now_seconds() - t0;

    t0 = now_seconds();
    KvStore cache = [&] {
        try {
            return KvStore::restore(hp, model.backend(), std::move(positions), int32_t(next_pos), reserve, types,
                                    std::move(low_positions));
        } catch (const Error & e) {
            throw file_error(path, std::string("corrupt SEGS section: ") + e.what());
        }
    }();
    const uint8_t * rows = data(rows_id.c_str());
    for (int il = 0; il < hp.n_layer; ++il)
        for (int h = 0; h < hp.n_head_kv; ++h)
            for (bool value : {false, true}) {
                cache.write_rows(il, h, value, rows);
                rows += uint64_t(cache.n_rows(il, h)) * (value ? v_row : k_row);
            }
    if (types.mixed()) {
        rows = data("LROW");
        for (int il = 0; il < hp.n_layer; ++il)
            for (int h = 0; h < hp.n_head_kv; ++h)
                for (bool value : {false, true}) {
                    cache.write_rows(il, h, value, rows, true);
                    rows += uint64_t(cache.n_low(il, h)) * low_row;
                }
    }
    const double build_s = now_seconds() - t0;
    return LoadedCacheFile{std::move(cache), std::move(content), std::move(meta), size, 0.0, verify_s, build_s};
}

nlohmann::json read_cache_file_meta(const std::string & path, CacheFileContent * content) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0) throw file_error(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode)) throw file_error(path, "not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    std::vector<uint8_t> head(std::min<uint64_t>(size, k_fixed));
    read_all(fd.fd, head.data(), head.size(), 0, path);
    size_t need = 0;
    parse_header(path, head.data(), head.size(), size, &need);
    head.resize(need);
    read_all(fd.fd, head.data(), need, 0, path);
    const auto secs = parse_header(path, head.data(), head.size(), size, &need);
    const Section & s = secs.at("META");
    std::vector<uint8_t> meta(s.size);
    read_all(fd.fd, meta.data(), meta.size(), s.offset, path);
    check_section(path, s, meta.data());
    nlohmann::json m = parse_meta(path, meta.data(), meta.size());
    if (!content) return m;
    const auto section = [&](const char * id) {
        const Section & x = secs.at(id);
        std::vector<uint8_t> b(x.size);
        read_all(fd.fd, b.data(), b.size(), x.offset, path);
        check_section(path, x, b.data());
        return b;
    };
    const std::vector<uint8_t> text = section("TEXT"), toks = section("TOKN");
    *content = read_content(path, m, text.data(), text.size(), toks.data(), toks.size(), 0);
    return m;
}

}  // namespace kvlab
