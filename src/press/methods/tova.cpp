// TOVA (docs/methods.md): attention of the last prompt query, averaged over all heads of the
// layer; one token set per layer; no sinks or window rule.
#include <algorithm>
#include <cstring>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {
namespace {

class LastQueryScorer : public Scorer {
public:
    LastQueryScorer(const Model & m, bool keep_last)
        : hp_(m.hparams()), n_threads_(m.n_threads()), keep_last_(keep_last) {}

    const QueryObserver * observer(KvStore &, int64_t L, double * observe_s) override {
        L_ = L;
        q_.assign(hp_.n_layer, std::vector<float>(size_t(hp_.n_head) * hp_.head_dim));
        seen_ = false;
        obs_.first = L - 1;
        obs_.on_queries = [this, observe_s](int il, int64_t tok0, int64_t n, const float * q) {
            const double t0 = now_seconds();
            const size_t per_row = q_[il].size();
            if (tok0 + n == L_) std::memcpy(q_[il].data(), q + (n - 1) * per_row, per_row * sizeof(float));
            seen_ = seen_ || tok0 + n == L_;
            *observe_s += now_seconds() - t0;
        };
        return &obs_;
    }

    Scores score(const KvStore & cache) override {
        const int64_t L = cache.n_rows(0, 0);
        if (!seen_ || L != L_) throw Error("press", "tova: the last query of the context was not observed");
        Scores s;
        s.L = L;
        s.per_layer = true;
        s.window = keep_last_ ? std::min<int64_t>(1, L) : 0;  // kvpress always keeps the last token
        s.s.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv));
        const int group = hp_.n_gqa(), d = hp_.head_dim;
        parallel_for(hp_.n_layer, n_threads_, [&](int64_t il) {
            std::vector<float> mean(size_t(L), 0.0f);
            for (int h = 0; h < hp_.n_head_kv; ++h) {
                const std::vector<float> k = keys(cache, int(il), h);
                for (int g = 0; g < group; ++g) {
                    const auto p =
                        kernels::last_query_attention(q_[il].data() + size_t(h * group + g) * d, k.data(), L, d);
                    for (int64_t j = 0; j < L; ++j) mean[j] += p[j] / float(hp_.n_head);
                }
            }
            s.s[il].assign(hp_.n_head_kv, mean);
        });
        return s;
    }

private:
    HParams hp_;
    int n_threads_;
    int64_t L_ = 0;
    bool seen_ = false, keep_last_ = false;
    std::vector<std::vector<float>> q_;  // [layer][n_head][head_dim]
    QueryObserver obs_;
};

// While decoding (TOVA's rule, accumulated over the interval): each row scored by its attention
// from the queries of the tokens decoded since the last compression (a query counts for the rows
// it saw), averaged over those queries and the KV head's group of query heads; with interval 1,
// exactly TOVA (the last token's attention).
class TovaSegments : public SegmentScorer {
public:
    explicit TovaSegments(const HParams & hp) : hp_(hp) {
        last_.assign(size_t(hp_.n_layer), std::vector<float>(size_t(hp_.n_head) * hp_.head_dim));
        obs_.on_queries = [this](int il, int64_t, int64_t n, const float * q) {
            const size_t per_row = last_[size_t(il)].size();
            std::copy_n(q + (n - 1) * int64_t(per_row), per_row, last_[size_t(il)].begin());
        };
    }
    const QueryObserver * observer() override { return &obs_; }
    void start(const KvStore &) override { queries_.clear(); }
    void after_token(const KvStore & cache) override { queries_.emplace_back(cache.next_pos() - 1, last_); }
    void compressed(const KvStore &) override { queries_.clear(); }
    std::unique_ptr<SegmentScorer> another() const override { return std::make_unique<TovaSegments>(hp_); }

    std::vector<float> score(const KvStore & cache, int il, int h) override {
        const std::vector<int32_t> & pos = cache.positions(il, h);
        const int64_t n = int64_t(pos.size());
        const int group = hp_.n_gqa(), d = hp_.head_dim;
        const std::vector<float> k = keys(cache, il, h);
        std::vector<float> sum(size_t(n), 0.0f), count(size_t(n), 0.0f);
        for (const auto & [p, q] : queries_) {
            const int64_t seen = std::upper_bound(pos.begin(), pos.end(), p) - pos.begin();
            for (int g = 0; g < group; ++g) {
                const std::vector<float> a =
                    kernels::last_query_attention(q[size_t(il)].data() + size_t(h * group + g) * d, k.data(), seen, d);
                for (int64_t r = 0; r < seen; ++r) sum[size_t(r)] += a[size_t(r)];
            }
            for (int64_t r = 0; r < seen; ++r) count[size_t(r)] += float(group);
        }
        for (int64_t r = 0; r < n; ++r)
            sum[size_t(r)] = count[size_t(r)] > 0 ? sum[size_t(r)] / count[size_t(r)] : 0.0f;
        return sum;
    }

private:
    HParams hp_;
    QueryObserver obs_;
    std::vector<std::vector<float>> last_;  // the last decoded token's queries [layer][n_head * head_dim]
    // those of the tokens decoded since the last compression, with their positions
    std::vector<std::pair<int32_t, std::vector<std::vector<float>>>> queries_;
};

std::unique_ptr<Scorer> make_scorer(const Params & p, const Model & m) {
    return std::make_unique<LastQueryScorer>(m, p.get_bool("keep_last"));
}

const MethodRegistrar reg([] {
    Registration r = uniform_method(
        MethodInfo{"tova",
                   "attention of the last context token, averaged over the layer's heads; one set per layer",
                   {{"keep_last", "false", "always keep the last context token (kvpress)"}},
                   false,
                   true},
        make_scorer);
    r.info.kvpress_params = {{"keep_last", "true"}};
    r.info.defaults_differ = "keep_last=false: TOVA's rule; kvpress always keeps the last context token";
    r.segment = [](const ParamMap & params, const Model & m) -> std::unique_ptr<SegmentScorer> {
        refuse_decode_params("tova", params);
        return std::make_unique<TovaSegments>(m.hparams());
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
