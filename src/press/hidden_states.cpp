#include "press/hidden_states.h"

#include <algorithm>
#include <cstring>

#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab::press {

const QueryObserver * HiddenStates::observe(const HParams & hp, int64_t L, double * observe_s) {
    L_ = L;
    n_embd_ = hp.n_embd;
    x_.assign(size_t(hp.n_layer), std::vector<float>(size_t(L) * size_t(n_embd_)));
    seen_.assign(size_t(hp.n_layer), 0);
    obs_ = QueryObserver{};
    obs_.first = 0;
    obs_.on_hidden = [this, observe_s](int il, int64_t tok0, int64_t n, const float * x) {
        const double t0 = now_seconds();
        n = std::min(n, L_ - tok0);  // tokens past the context (none in a plain prefill) are not kept
        if (n > 0) {
            std::memcpy(x_[size_t(il)].data() + tok0 * n_embd_, x, size_t(n * n_embd_) * sizeof(float));
            seen_[size_t(il)] += n;
        }
        *observe_s += now_seconds() - t0;
    };
    return &obs_;
}

bool HiddenStates::complete(int64_t L) const {
    if (L != L_ || x_.empty()) return false;
    for (int64_t s : seen_)
        if (s != L_) return false;
    return true;
}

std::vector<float> HiddenStates::take(int il) {
    KVLAB_ASSERT(x_[size_t(il)].size() == size_t(L_ * n_embd_), "each layer's hidden states are taken once");
    return std::move(x_[size_t(il)]);
}

}  // namespace kvlab::press
