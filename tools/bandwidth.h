// The decode bandwidth bound of `kvlab bench`: a decode step reads every weight a token passes
// through (the embedding table only when it is also the output head) and every K/V row the
// cache holds; at the machine's measured read bandwidth that takes at least bytes / bandwidth.
#pragma once

#include <cstdint>

#include "kvlab/cache.h"
#include "kvlab/model.h"

namespace kvlab::cli {

// Bytes a decode step on this cache reads: the model's weights (less the token embedding table
// when a separate output head exists: one row of it is gathered) plus the cache's K/V rows.
uint64_t decode_bytes_per_token(const Model & model, const KvStore & cache);

// Read bandwidth in bytes/s over a buffer far larger than the caches (256 MiB), summed by
// `threads` threads with vector loads; the best of 5 passes.
double measure_read_bandwidth(int threads);

}  // namespace kvlab::cli
