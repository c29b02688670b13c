// Where the server's stored contexts live beyond its memory: a folder of cache files (one
// machine) or a Redis-protocol server shared by replicas (docs/server.md, "Replicas"). The
// entries are cache files (src/cache/cache_file.cpp) either way, checked when read: a corrupt,
// foreign or half-written entry is refused, never served.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvlab/cache_file.h"
#include "kvlab/model.h"
#include "server/api_error.h"

namespace kvlab::server {

// A stored context without its rows: what listing and prefix matching need.
struct StoredEntry {
    std::string id;
    CacheFileContent content;  // text, tokens and the API object (context)
    uint64_t bytes = 0;        // the entry's size in the store
};

// The store's traffic, for /metrics (counts since start).
struct BackendCounts {
    uint64_t hits = 0;     // entries read (rows loaded, or a context another replica made reused)
    uint64_t misses = 0;   // entries looked for and absent (evicted, deleted, never made)
    uint64_t writes = 0;   // entries written
    uint64_t errors = 0;   // operations that failed (store unreachable, corrupt or foreign entries)
    uint64_t bytes_read = 0, bytes_written = 0;
};

// Held while a context is made, so that replicas asked for the same one at once make it once.
class CreationLock {
public:
    virtual ~CreationLock() = default;
};

class ContextBackend {
public:
    virtual ~ContextBackend() = default;
    // "folder /path" or "redis://host:port/db": for logs and /health.
    virtual std::string describe() const = 0;
    // Every entry made with this model (others are reported on stderr and left alone).
    virtual std::vector<StoredEntry> scan() = 0;
    // A number that changes when another process may have added or removed entries since the last
    // call (a folder has no other writer: always 0). Throws ApiError(503) when unreachable.
    virtual uint64_t generation() = 0;
    // The entry's description alone; nullopt when absent.
    virtual std::optional<StoredEntry> find(const std::string & id) = 0;
    // Writes the entry whole or not at all; returns its bytes. An entry of that id that exists is
    // replaced by the same content (ids are content addresses).
    virtual uint64_t put(const std::string & id, const KvStore & rows, const CacheFileContent & content) = 0;
    // The rows read back and checked. Throws ApiError(404, "context_not_found") when the entry is
    // gone, ApiError(500, "context_unreadable") when it is corrupt or foreign (logged with the
    // reason), ApiError(503, "store_unavailable") when the store cannot be reached.
    virtual LoadedCacheFile get(const std::string & id) = 0;
    virtual bool remove(const std::string & id) = 0;
    // Exclusive among every process sharing the store until the returned lock is destroyed; waits
    // while another holds it (a holder that dies loses it within seconds). nullptr when the store
    // has one process (a folder: the server's own lock suffices).
    virtual std::unique_ptr<CreationLock> lock(const std::string & id) = 0;
    virtual BackendCounts counts() const = 0;
    // Whether the store answered its last operation.
    virtual bool healthy() const = 0;
};

// "redis://HOST:PORT[/DB]" -> a Redis back end (throws kvlab::Error when the server cannot be
// reached); anything else names a folder (created when missing).
std::unique_ptr<ContextBackend> open_context_backend(const std::string & spec, const Model & model);
std::unique_ptr<ContextBackend> open_folder_backend(const std::string & dir, const Model & model);
std::unique_ptr<ContextBackend> open_redis_backend(const std::string & url, const Model & model);

// 503 naming the store: what a request gets while the shared store cannot be reached.
ApiError store_unavailable(const std::string & store, const std::string & why);

}  // namespace kvlab::server
