#include "press/window_queries.h"

#include <algorithm>
#include <cstring>

#include "kvlab/sys.h"

namespace kvlab::press {

const QueryObserver * WindowQueries::observe(const HParams & hp, int64_t w, int64_t L, double * observe_s) {
    L_ = L;
    rows_ = std::min<int64_t>(w, L);
    const size_t per_row = size_t(hp.n_head) * hp.head_dim;
    q_.assign(size_t(hp.n_layer), std::vector<float>(size_t(rows_) * per_row));
    seen_ = 0;
    obs_ = QueryObserver{};
    obs_.first = L - rows_;
    obs_.on_queries = [this, per_row, observe_s](int il, int64_t tok0, int64_t n, const float * q) {
        const double t0 = now_seconds();
        const int64_t r0 = tok0 - (L_ - rows_);  // window row of q's first row
        for (int64_t r = 0; r < n; ++r)
            if (r0 + r >= 0 && r0 + r < rows_)
                std::memcpy(q_[size_t(il)].data() + (r0 + r) * per_row, q + r * per_row, per_row * sizeof(float));
        if (il == 0) seen_ += n;
        *observe_s += now_seconds() - t0;
    };
    return &obs_;
}

}  // namespace kvlab::press
