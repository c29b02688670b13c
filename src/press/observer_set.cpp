// ObserverSet: several methods' observers (queries, hidden states) behind the one observer a prefill takes.
#include <algorithm>
#include <limits>

#include "press/method.h"

namespace kvlab {

ObserverSet::ObserverSet(const Model & model)
    : per_row_(int64_t(model.hparams().n_head) * model.hparams().head_dim), n_embd_(model.hparams().n_embd) {
    all_.first = std::numeric_limits<int64_t>::max();
}

void ObserverSet::add(const QueryObserver * o) {
    if (!o) return;
    obs_.push_back(o);
    all_.first = std::min(all_.first, o->first);
    // each callback only where an observer wants it: the engine copies out only what is asked
    if (o->on_queries && !all_.on_queries)
        all_.on_queries = [this](int il, int64_t tok0, int64_t n, const float * q) {
            for (const QueryObserver * x : obs_)
                if (x->on_queries && tok0 + n > x->first) {
                    const int64_t skip = std::max<int64_t>(0, x->first - tok0);
                    x->on_queries(il, tok0 + skip, n - skip, q + skip * per_row_);
                }
        };
    if (o->on_hidden && !all_.on_hidden)
        all_.on_hidden = [this](int il, int64_t tok0, int64_t n, const float * h) {
            for (const QueryObserver * x : obs_)
                if (x->on_hidden && tok0 + n > x->first) {
                    const int64_t skip = std::max<int64_t>(0, x->first - tok0);
                    x->on_hidden(il, tok0 + skip, n - skip, h + skip * n_embd_);
                }
        };
}

const QueryObserver * ObserverSet::get() const {
    return obs_.empty() ? nullptr : &all_;
}

}  // namespace kvlab
