// ObserverSet: several methods' query observers behind the one observer a prefill takes.
#include <algorithm>
#include <limits>

#include "press/method.h"

namespace kvlab {

ObserverSet::ObserverSet(const Model & model) : per_row_(int64_t(model.hparams().n_head) * model.hparams().head_dim) {
    all_.first = std::numeric_limits<int64_t>::max();
    all_.on_queries = [this](int il, int64_t tok0, int64_t n, const float * q) {
        for (const QueryObserver * o : obs_)
            if (tok0 + n > o->first) {
                const int64_t skip = std::max<int64_t>(0, o->first - tok0);
                o->on_queries(il, tok0 + skip, n - skip, q + skip * per_row_);
            }
    };
}

void ObserverSet::add(const QueryObserver * o) {
    if (!o) return;
    obs_.push_back(o);
    all_.first = std::min(all_.first, o->first);
}

const QueryObserver * ObserverSet::get() const {
    return obs_.empty() ? nullptr : &all_;
}

}  // namespace kvlab
