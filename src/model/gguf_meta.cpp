// GGUF opening with precise errors, and the deterministic metadata summary (see gguf_meta.h).
#include "model/gguf_meta.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

// ---- opening ----

// Reads for gguf_init_from_callback with pread, and records whether the parser asked for bytes
// beyond the end of the file: that is how a truncated header is told apart from a corrupt one.
struct FileReader {
    int fd = -1;
    uint64_t size = 0;
    bool read_past_end = false;
};

size_t read_at(void * userdata, void * output, uint64_t offset, size_t len) {
    auto & r = *static_cast<FileReader *>(userdata);
    if (offset + len > r.size) r.read_past_end = true;
    size_t done = 0;
    while (done < len) {
        const ssize_t n = pread(r.fd, static_cast<char *>(output) + done, len - done, off_t(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += size_t(n);
    }
    return done;
}

// The parser checks each read against the bytes it believes remain; telling it the file is this
// much longer lets a read that crosses the real end reach read_at, which records it.
constexpr uint64_t k_size_slack = uint64_t(16) << 20;

struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) close(fd);
    }
};

std::string magic_text(const unsigned char m[4]) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%02x %02x %02x %02x", m[0], m[1], m[2], m[3]);
    std::string shown;
    for (int i = 0; i < 4; ++i) shown += (m[i] >= 32 && m[i] < 127) ? char(m[i]) : '.';
    return "magic '" + shown + "' = " + hex + ", expected 'GGUF'";
}

// ---- canonical serialisation ----
//
// The tokenizer and metadata hashes are SHA-256 over this serialisation of KVs, concatenated in
// the order the file stores them (all integers little-endian):
//   key     : u64 byte length, then the key's bytes
//   type    : i32 gguf_type of the value
//   scalar  : the value's bytes (bool as 1 byte, as GGUF stores it); a string is u64 length + bytes
//   array   : i32 gguf_type of the elements, u64 element count, then each element as a scalar
// This is the GGUF v3 on-disk encoding of the KV section, so the hashes depend only on the file's
// metadata, not on the ggml version reading it. (Strings are taken up to a NUL, as gguf.h gives
// them as C strings; GGUF strings in practice contain none.)
static_assert(std::endian::native == std::endian::little, "the canonical serialisation assumes little-endian");

size_t scalar_size(gguf_type t) {
    switch (t) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_BOOL:
            return 1;
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_INT16:
            return 2;
        case GGUF_TYPE_UINT32:
        case GGUF_TYPE_INT32:
        case GGUF_TYPE_FLOAT32:
            return 4;
        case GGUF_TYPE_UINT64:
        case GGUF_TYPE_INT64:
        case GGUF_TYPE_FLOAT64:
            return 8;
        default:
            return 0;  // string, array, unknown
    }
}

template <typename T>
void put(std::string & out, T v) {
    out.append(reinterpret_cast<const char *>(&v), sizeof(v));
}

void put_string(std::string & out, const char * s) {
    const uint64_t n = std::strlen(s);
    put(out, n);
    out.append(s, n);
}

void serialise_kv(std::string & out, const gguf_context * ctx, int64_t id) {
    const char * key = gguf_get_key(ctx, id);
    const gguf_type type = gguf_get_kv_type(ctx, id);
    put_string(out, key);
    put(out, int32_t(type));
    if (type == GGUF_TYPE_ARRAY) {
        const gguf_type et = gguf_get_arr_type(ctx, id);
        const uint64_t n = gguf_get_arr_n(ctx, id);
        put(out, int32_t(et));
        put(out, n);
        if (et == GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < n; ++i) put_string(out, gguf_get_arr_str(ctx, id, i));
        } else if (const size_t es = scalar_size(et); es > 0) {
            out.append(static_cast<const char *>(gguf_get_arr_data(ctx, id)), n * es);
        } else {
            throw Error("gguf", std::string("KV ") + key + " is an array of unsupported type " + std::to_string(et));
        }
    } else if (type == GGUF_TYPE_STRING) {
        put_string(out, gguf_get_val_str(ctx, id));
    } else if (const size_t s = scalar_size(type); s > 0) {
        out.append(static_cast<const char *>(gguf_get_val_data(ctx, id)), s);
    } else {
        throw Error("gguf", std::string("KV ") + key + " has unsupported type " + std::to_string(type));
    }
}

}  // namespace

gguf_context_ptr open_gguf_checked(const std::string & path, bool no_alloc, ggml_context_ptr * out_ctx) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) throw Error("gguf", "no such file: " + path);
        throw Error("gguf", "cannot open " + path + ": " + std::strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) throw Error("gguf", path + " is a directory, not a GGUF file");
    if (!S_ISREG(st.st_mode)) throw Error("gguf", path + " is not a regular file");

    Fd fd{open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) throw Error("gguf", "cannot open " + path + ": " + std::strerror(errno));
    FileReader reader{fd.fd, uint64_t(st.st_size), false};

    unsigned char magic[4] = {0, 0, 0, 0};
    const size_t n_magic = read_at(&reader, magic, 0, 4);
    if (n_magic < 4) {
        throw Error("gguf", path + " is not a GGUF file (only " + std::to_string(n_magic) + " bytes)");
    }
    if (std::memcmp(magic, GGUF_MAGIC, 4) != 0) {
        throw Error("gguf", path + " is not a GGUF file (" + magic_text(magic) + ")");
    }

    // Parse the header alone first (cheap), so that the sizes can be checked before any data is read.
    const bool header_only = no_alloc || out_ctx == nullptr;
    ggml_context * meta = nullptr;
    gguf_init_params hp{/*no_alloc=*/true, header_only && out_ctx ? &meta : nullptr};
    gguf_context_ptr ctx(gguf_init_from_callback(read_at, &reader, 0, reader.size + k_size_slack, hp));
    ggml_context_ptr meta_ptr(meta);
    if (!ctx) {
        if (reader.read_past_end) {
            throw Error("gguf", path + " is truncated: its GGUF header runs past the end of the file (" +
                                    std::to_string(reader.size) + " bytes)");
        }
        throw Error("gguf", "could not parse GGUF header of " + path + " (" + std::to_string(reader.size) +
                                " bytes; corrupt or unsupported)");
    }

    uint64_t need = gguf_get_data_offset(ctx.get());
    uint64_t data_bytes = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) {
        data_bytes =
            std::max<uint64_t>(data_bytes, gguf_get_tensor_offset(ctx.get(), i) + gguf_get_tensor_size(ctx.get(), i));
    }
    need += data_bytes;
    if (reader.size < need) {
        throw Error("gguf", path + " is truncated: it has " + std::to_string(reader.size) +
                                " bytes but its header and tensor data need " + std::to_string(need));
    }
    if (header_only) {
        if (out_ctx) *out_ctx = std::move(meta_ptr);
        return ctx;
    }

    ctx.reset();
    gguf_init_params dp{/*no_alloc=*/false, &meta};
    ctx.reset(gguf_init_from_callback(read_at, &reader, 0, reader.size, dp));
    if (!ctx) throw Error("gguf", "could not read the tensor data of " + path);
    out_ctx->reset(meta);
    return ctx;
}

namespace {

// Type of KV key_id as text, in gguf's own names: "u32", "str", "arr[str]", ...
std::string kv_type_name(const gguf_context * ctx, int64_t key_id) {
    auto name = [](gguf_type t) {
        const char * n = ::gguf_type_name(t);
        return n ? std::string(n) : "unknown(" + std::to_string(int(t)) + ")";
    };
    const gguf_type t = gguf_get_kv_type(ctx, key_id);
    if (t == GGUF_TYPE_ARRAY) return name(t) + "[" + name(gguf_get_arr_type(ctx, key_id)) + "]";
    return name(t);
}

}  // namespace

std::string gguf_string(const gguf_context * ctx, const std::string & key) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0 || gguf_get_kv_type(ctx, id) != GGUF_TYPE_STRING) return "";
    return gguf_get_val_str(ctx, id);
}

GgufSummary summarize_gguf(const gguf_context * ctx) {
    GgufSummary s;
    s.gguf_version = gguf_get_version(ctx);
    s.n_kv = gguf_get_n_kv(ctx);
    s.n_tensors = gguf_get_n_tensors(ctx);

    s.arch = gguf_string(ctx, "general.architecture");

    for (int64_t i = 0; i < s.n_tensors; ++i) {
        const std::string type = ggml_type_name(gguf_get_tensor_type(ctx, i));
        s.tensor_type_counts[type] += 1;
        s.tensor_type_bytes[type] += gguf_get_tensor_size(ctx, i);
    }

    Sha256 tokenizer, metadata;
    std::string rec;
    for (int64_t i = 0; i < s.n_kv; ++i) {
        const std::string key = gguf_get_key(ctx, i);
        rec.clear();
        serialise_kv(rec, ctx, i);
        metadata.update(rec.data(), rec.size());
        if (key == "tokenizer.chat_template") {
            if (gguf_get_kv_type(ctx, i) != GGUF_TYPE_STRING) {
                throw Error("gguf", "tokenizer.chat_template is not a string (" + kv_type_name(ctx, i) + ")");
            }
            const char * t = gguf_get_val_str(ctx, i);
            s.chat_template_sha256 = sha256_hex(t, std::strlen(t));
        } else if (key.starts_with("tokenizer.")) {
            tokenizer.update(rec.data(), rec.size());
        }
    }
    s.tokenizer_sha256 = tokenizer.hex();
    s.metadata_sha256 = metadata.hex();
    return s;
}

nlohmann::json to_json(const GgufSummary & s) {
    return {
        {"arch", s.arch},
        {"gguf_version", s.gguf_version},
        {"n_kv", s.n_kv},
        {"n_tensors", s.n_tensors},
        {"tensor_type_counts", s.tensor_type_counts},
        {"tensor_type_bytes", s.tensor_type_bytes},
        {"tokenizer_sha256", s.tokenizer_sha256},
        {"chat_template_sha256",
         s.chat_template_sha256.empty() ? nlohmann::json(nullptr) : nlohmann::json(s.chat_template_sha256)},
        {"metadata_sha256", s.metadata_sha256},
    };
}

}  // namespace kvlab
