// A cache compressed in place by any press, a registered method's or a caller's (a Python
// scorer's callback press): the flow kvlab.compress runs, one for both.
#pragma once

#include <cstdint>
#include <vector>

#include "kvlab/engine.h"
#include "kvlab/press.h"
#include "kvlab/text.h"

namespace kvlab::app {

struct InPlace {
    CompressStats stats;
    bool reprefilled = false;  // the context was prefilled again with the press watching
};

// Compresses `cache` with `press` at `budget`, leaving no reserve. `context` holds the tokens the
// cache is a plain prefill of, from position 0 (empty when it is not one: compressed, generated
// from, or fed anything else). A press that scores from the prefill (Press::observes), or a plain
// prefill whose sliding-window layers already freed rows (every layer's rows are scored), gets the
// context prefilled again into a new cache with the press watching (its scoring passes run; `tok`
// is needed for those), and that cache, compressed, replaces `cache`. Otherwise `cache` is planned
// and compacted as it is. Throws kvlab::Error, leaving `cache` as it was, for a press that observes
// when `context` is empty, and for whatever the press or the budget refuse.
InPlace compress_in_place(Engine & engine, const Tokenizer * tok, KvStore & cache, const std::vector<int32_t> & context,
                          Press & press, const Budget & budget);

}  // namespace kvlab::app
