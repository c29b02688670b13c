// Cache files (.kvc): a prefilled, possibly compressed context that outlives the process.
//
// Versioned and self-describing. Layout (little-endian):
//   "KVLABKVC"  u32 format version  u32 n_sections
//   n_sections x { char id[4]; u32 flags = 0; u64 offset; u64 size; u8 sha256[32] }
//   u8 sha256[32] of every byte above (the header's own checksum)
//   sections, each at a 64-byte aligned offset:
//     META  JSON: format, model {file, sha256, hparams_hash, hparams}, next_pos, rows,
//           kv_bytes, cache_types {k, v (f16, q8_0, q4_0), rotate, low (demoted rows)}, rows_demoted, created_unix,
//           kvlab {version, commit}, and the caller's "context" object (method, params, budget, timings, ...)
//     TEXT  the context's text as given (UTF-8; empty when it was given as token ids)
//     TOKN  i32 [n_tokens] the context's token ids (n_tokens == next_pos)
//     SEGS  per layer, per KV head: u32 n_rows, then i32 [n_rows] ascending positions
//     ROWS  per layer, per KV head: K rows [n_rows] of cache_types.k (a row: head_dim values,
//           ggml's block layout for q8_0 / q4_0), then V rows of cache_types.v
//     LSEG  (version 3, a mixed-precision store: META cache_types.low set) the demoted runs'
//           positions, laid out as SEGS
//     LROW  their K and V rows of cache_types.low, laid out as ROWS
// Version 1 files (no cache_types; KVF6 instead of ROWS, F16 rows) and version 2 files (no
// demoted rows) still load.
// Written atomically: a temporary file in the same folder, fsync, rename, fsync of the
// folder; a crash at any point leaves the previous file intact. Read with one read() and
// fully checked (header and section checksums, bounds, model identity) before any row is
// used: a truncated, corrupt, tampered, foreign-model or future-version file is refused
// with a kvlab::Error that says which.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvlab/cache.h"
#include "kvlab/model.h"
#include "kvlab/text.h"

namespace kvlab {

constexpr uint32_t k_cache_file_version = 3;

// What a cache file holds besides the rows.
struct CacheFileContent {
    std::string text;                                   // the context's text ("" when made from token ids)
    std::vector<int32_t> tokens;                        // the context's tokens: the positions 0 .. n-1 of the store
    nlohmann::json context = nlohmann::json::object();  // method, params, budget, timings, ...
};

// The messages a context starts with (a system message), kept in its object as "before":
// [{role, content}]. Askers rebuild the prompt from them and the text.
nlohmann::json before_json(const std::vector<ChatMessage> & before);
std::vector<ChatMessage> context_before(const nlohmann::json & context);

// Writes the store (its held rows only, not its reserve) and the content to path,
// atomically. Throws kvlab::Error naming the path on any failure (the old file stays).
// Returns the bytes written.
uint64_t save_cache_file(const std::string & path, const Model & model, const KvStore & cache,
                         const CacheFileContent & content);

struct LoadedCacheFile {
    KvStore cache;
    CacheFileContent content;
    nlohmann::json meta;  // the whole META section
    uint64_t file_bytes = 0;
    double read_s = 0.0;    // the read() of the whole file
    double verify_s = 0.0;  // checksums and structure
    double build_s = 0.0;   // rows into a new store
    double seconds() const { return read_s + verify_s + build_s; }
};

// Reads and checks a cache file made for `model`, into a store with room for `reserve`
// more rows per segment.
LoadedCacheFile load_cache_file(const std::string & path, const Model & model, int64_t reserve);

// The same format in memory (a shared store's entries): the bytes save_cache_file would write,
// and their reading, checked as a file's is (`name` labels the errors in place of a path).
std::string encode_cache_file(const Model & model, const KvStore & cache, const CacheFileContent & content);
LoadedCacheFile decode_cache_file(const std::string & name, const uint8_t * data, size_t size, const Model & model,
                                  int64_t reserve);

// The META section alone (header and META checksums verified; rows not read): for listing.
// With `content`, also the context's text and tokens (TEXT and TOKN, checked) into it.
nlohmann::json read_cache_file_meta(const std::string & path, CacheFileContent * content = nullptr);

}  // namespace kvlab
