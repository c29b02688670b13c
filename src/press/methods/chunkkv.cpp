// ChunkKV (docs/methods.md), a wrapper on any scorer: the candidate rows are cut into chunks
// of `chunk` consecutive tokens, ranked by their summed score over the layer's heads, and
// kept whole in rank order; the last chunk that fits only in part keeps its best rows.
// The same rows for every head of a layer.
#include <algorithm>
#include <numeric>

#include "kvlab/error.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab::press {

namespace {

// kvpress's ChunkKVPress: chunks of `chunk` rows over the whole context (forced rows
// included, scored above all as its padded window scores are), ranked by the mean of the
// rows' scores summed over the heads (the last, partial chunk too); the top
// max(1, int(n_chunks keep)) chunks are kept whole, whatever that leaves of the budget.
KeepPlan chunk_select_kvpress(const Scores & s, double keep, int64_t chunk) {
    KeepPlan plan(s.s.size());
    const int64_t n_chunks = (s.L + chunk - 1) / chunk;
    const int64_t n_kept = std::clamp<int64_t>(int64_t(double(n_chunks) * keep), 1, n_chunks);
    for (size_t il = 0; il < s.s.size(); ++il) {
        std::vector<double> mean(size_t(n_chunks), 0.0);
        std::vector<char> forced(size_t(n_chunks), 0);
        for (int64_t j = 0; j < s.L; ++j) {
            if (s.is_forced(j)) forced[j / chunk] = 1;
            double sum = 0.0;
            for (size_t h = 0; h < s.s[il].size(); ++h) sum += s.s[il][h][j];
            mean[j / chunk] += sum / double(std::min(chunk, s.L - j / chunk * chunk));
        }
        std::vector<int64_t> order(static_cast<size_t>(n_chunks));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
            return forced[a] != forced[b] ? forced[a] > forced[b] : mean[a] > mean[b];
        });
        std::sort(order.begin(), order.begin() + n_kept);
        std::vector<int32_t> kept;
        for (int64_t i = 0; i < n_kept; ++i)
            for (int64_t j = order[i] * chunk; j < std::min(s.L, (order[i] + 1) * chunk); ++j)
                kept.push_back(int32_t(j));
        plan[il].assign(s.s[il].size(), kept);
    }
    return plan;
}

KeepPlan chunk_select(const Scores & s, int64_t B, int64_t chunk) {
    check_budget(s, B);
    KeepPlan plan(s.s.size());
    const std::vector<int32_t> cand = candidate_rows(s);
    const int64_t nc = int64_t(cand.size());
    const int64_t want = std::clamp<int64_t>(B - s.forced(), 0, nc);
    for (size_t il = 0; il < s.s.size(); ++il) {
        std::vector<float> sum(size_t(nc), 0.0f);
        for (size_t h = 0; h < s.s[il].size(); ++h) {
            const auto cs = candidate_scores(s, int(il), int(h));
            for (int64_t j = 0; j < nc; ++j) sum[j] += cs[j];
        }
        const int64_t n_chunks = (nc + chunk - 1) / chunk;
        std::vector<double> cscore(size_t(n_chunks), 0.0);
        for (int64_t j = 0; j < nc; ++j) cscore[j / chunk] += sum[j];
        std::vector<int64_t> order(static_cast<size_t>(n_chunks));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cscore[a] > cscore[b]; });
        int64_t left = want;
        std::vector<char> keep(size_t(nc), 0);
        for (int64_t c : order) {
            if (left <= 0) break;
            const int64_t a = c * chunk, e = std::min(nc, a + chunk);
            if (e - a <= left) {
                for (int64_t j = a; j < e; ++j) keep[j] = 1;
                left -= e - a;
            } else {  // the best rows of the chunk that fits in part
                std::vector<int64_t> rows(size_t(e - a));
                std::iota(rows.begin(), rows.end(), a);
                std::stable_sort(rows.begin(), rows.end(), [&](int64_t x, int64_t y) { return sum[x] > sum[y]; });
                for (int64_t t = 0; t < left; ++t) keep[rows[t]] = 1;
                left = 0;
            }
        }
        std::vector<int32_t> kept;
        for (int64_t j = 0; j < s.L; ++j)
            if (s.is_forced(j)) kept.push_back(int32_t(j));
        for (int64_t j = 0; j < nc; ++j)
            if (keep[j]) kept.push_back(cand[j]);
        std::sort(kept.begin(), kept.end());
        plan[il].assign(s.s[il].size(), kept);
    }
    return plan;
}

const MethodRegistrar reg([] {
    Registration r;
    r.info = {"chunkkv",
              "wrapper: keeps whole chunks of consecutive tokens ranked by summed base score; one set per layer",
              {{"chunk", "20", "tokens per chunk"},
               {"chunking",
                "kvlab",
                "kvlab: chunks of the candidate rows fill the budget exactly (the last in part, by its best rows); "
                "kvpress: max(1, int(n_chunks (1 - cr))) whole chunks of all rows, ranked by mean score",
                {"kvlab", "kvpress"}}},
              true,
              false};
    r.make = [](const Params & p, const Model & m) {
        const int64_t chunk = p.get_int("chunk");
        if (chunk < 1) throw Error("press", "chunkkv: chunk must be at least 1");
        const bool kvpress = p.get_string("chunking") == "kvpress";
        return scored_press(make_base_scorer(p, m),
                            [chunk, kvpress](const Scores & s, const Budget & b, const KvStore &) {
                                if (kvpress) {
                                    if (b.tokens < 0 && b.ratio == 0.0)
                                        return select_per_layer_budget(s, std::vector<int64_t>(s.s.size(), s.L));
                                    return chunk_select_kvpress(s, b.keep_fraction(s.L), chunk);
                                }
                                return chunk_select(s, b.per_layer(s.L), chunk);
                            });
    };
    r.info.kvpress_params = kvpress_window_params({{"chunking", "kvpress"}});
    r.info.defaults_differ =
        "chunking=kvlab: chunks of the candidate rows fill the budget exactly (the window kept apart); kvpress keeps "
        "int(n_chunks (1 - cr)) whole chunks of all rows by mean score and may end below the budget";
    return r;
});

}  // namespace

}  // namespace kvlab::press
