#include "app/compress_in_place.h"

#include "kvlab/error.h"
#include "kvlab/session.h"

namespace kvlab::app {

InPlace compress_in_place(Engine & engine, const Tokenizer * tok, KvStore & cache, const std::vector<int32_t> & context,
                          Press & press, const Budget & budget) {
    const bool slid = !context.empty() && !cache.uniform();
    InPlace out;
    out.reprefilled = press.observes() || slid;
    if (!out.reprefilled) {
        // compress() plans before it touches the store and compacts into a new buffer: an error
        // (the press's, the budget's) leaves the cache as it was, without a copy
        out.stats = kvlab::compress(press, cache, budget, 0);
        return out;
    }
    if (context.empty())
        throw Error("compress", press.name() +
                                    " scores from the prefill: it compresses a cache that holds a plain prefill of "
                                    "a known context");
    ContextSession session(engine, press, SessionOptions{0, 0, tok, cache.types()});
    session.prefill(context);
    PreparedCache p = session.compress_prefilled(0, budget);
    out.stats = p.stats;
    cache = std::move(p.cache);
    return out;
}

}  // namespace kvlab::app
