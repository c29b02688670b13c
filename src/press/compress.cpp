// compress(): a press's plan applied to the store (the only place a plan is applied), with its
// statistics; sliding-window layers keep what their next query sees.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/sys.h"

namespace kvlab {

nlohmann::json CompressStats::to_json() const {
    nlohmann::json j = {{"plan_s", plan_s},
                        {"observe_s", observe_s},
                        {"apply_s", apply_s},
                        {"seconds", seconds()},
                        {"rows_before", rows_before},
                        {"rows_after", rows_after},
                        {"bytes_before", bytes_before},
                        {"bytes_after", bytes_after},
                        {"used_before", used_before},
                        {"used_after", used_after},
                        {"kept", kept},
                        {"rows_demoted", rows_demoted}};
    if (budget_bytes >= 0) {
        j["budget_bytes"] = budget_bytes;
        j["rows_high_per_segment"] = rows_high;
        j["rows_per_segment"] = rows_total;
    }
    return j;
}

std::vector<int> compressed_layers(const KvStore & cache, const Budget & budget) {
    std::vector<int> layers;
    for (int il = 0; il < cache.n_layer(); ++il)
        if (budget.sliding || cache.window(il) == 0) layers.push_back(il);
    return layers;
}

namespace {

// On a sliding-window layer a compressed cache keeps what the layer's next query can see:
// every such row (the layer is not compressed) or those of them the method chose.
void restrict_sliding_layers(KeepPlan & plan, const KvStore & cache, const Budget & budget) {
    for (int il = 0; il < cache.n_layer(); ++il) {
        const int32_t w = cache.window(il);
        if (w == 0) continue;
        for (int h = 0; h < cache.n_head_kv(); ++h) {
            const std::vector<int32_t> & pos = cache.positions(il, h);
            const auto first = int32_t(std::upper_bound(pos.begin(), pos.end(), cache.next_pos() - w) - pos.begin());
            std::vector<int32_t> rows;
            if (budget.sliding) {
                for (int32_t r : plan[il][h])
                    if (r >= first) rows.push_back(r);
            } else {
                for (int32_t r = first; r < int32_t(pos.size()); ++r) rows.push_back(r);
            }
            plan[il][h] = std::move(rows);
        }
    }
}

// The bytes a byte budget allows and the rows per compressed (layer, head) segment it gives:
// `high` at the cache types, `total` in all (total - high demoted). Every segment of a
// compressed layer holds L rows now; the layers a budget does not compress keep what their
// next query sees (min(L, window - 1) rows) at the cache types, and their bytes count too.
struct ByteCounts {
    int64_t bytes = 0, high = 0, total = 0;
};

ByteCounts byte_counts(const KvStore & cache, const Budget & b) {
    const int64_t L = cache.next_pos();
    const uint64_t f16_row = 2 * cache_row_bytes(GGML_TYPE_F16, cache.head_dim());
    ByteCounts c;
    c.bytes = b.kv_bytes >= 0 ? b.kv_bytes
                              : int64_t(std::floor(b.bytes_ratio * double(uint64_t(cache.full_rows(L)) * f16_row)));
    const std::vector<int> layers = compressed_layers(cache, b);
    int64_t fixed = 0;
    for (int il = 0; il < cache.n_layer(); ++il)
        if (std::find(layers.begin(), layers.end(), il) == layers.end())
            fixed += std::min<int64_t>(L, cache.window(il) - 1) * cache.n_head_kv() * int64_t(cache.row_bytes());
    const int64_t segs = int64_t(layers.size()) * cache.n_head_kv();
    if (segs == 0 || c.bytes <= fixed)
        throw Error("press", "a byte budget of " + std::to_string(c.bytes) + " bytes does not exceed the " +
                                 std::to_string(fixed) + " bytes of the sliding-window layers' rows");
    const double per = double(c.bytes - fixed) / double(segs);  // bytes per compressed segment
    const double h = double(cache.row_bytes());
    const double l = b.demotes() ? 2.0 * double(cache_row_bytes(b.demote, cache.head_dim())) : 0.0;
    if (!b.demotes()) {
        c.high = c.total = int64_t(std::floor(per / h));
    } else if (b.high_share >= 0.0) {
        c.high = int64_t(std::floor(b.high_share * per / h));
        c.total = c.high + int64_t(std::floor((per - double(c.high) * h) / l));
    } else if (double(L) * l <= per) {  // every row kept, as many at the cache types as fit
        c.total = L;
        c.high = h > l ? int64_t(std::floor((per - double(L) * l) / (h - l))) : 0;
    } else {  // every kept row demoted
        c.total = int64_t(std::floor(per / l));
    }
    c.total = std::min(c.total, L);
    c.high = std::min(c.high, c.total);
    if (c.total < 1)
        throw Error("press", "a byte budget of " + std::to_string(c.bytes) + " bytes holds no row per segment (" +
                                 std::to_string(int64_t(per)) + " bytes each, a row takes " +
                                 std::to_string(int64_t(b.demotes() ? l : h)) + ")");
    return c;
}

// The rows of `all` not in `high`, on the layers that demote (those without a window); on the
// others `high` becomes `all` (what the sliding-window rule left).
KeepPlan demoted_rows(KeepPlan & high, const KeepPlan & all, const KvStore & cache) {
    KeepPlan low(all.size());
    for (size_t il = 0; il < all.size(); ++il) {
        low[il].resize(all[il].size());
        if (cache.window(int(il)) > 0) {
            high[il] = all[il];
            continue;
        }
        for (size_t h = 0; h < all[il].size(); ++h) {
            std::vector<int32_t> hi;
            std::set_intersection(high[il][h].begin(), high[il][h].end(), all[il][h].begin(), all[il][h].end(),
                                  std::back_inserter(hi));
            std::set_difference(all[il][h].begin(), all[il][h].end(), hi.begin(), hi.end(),
                                std::back_inserter(low[il][h]));
            high[il][h] = std::move(hi);
        }
    }
    return low;
}

// Every row of every segment (the rows a ratio budget that demotes keeps in all).
KeepPlan every_row(const KvStore & cache) {
    KeepPlan all(cache.n_layer(), std::vector<std::vector<int32_t>>(cache.n_head_kv()));
    for (int il = 0; il < cache.n_layer(); ++il)
        for (int h = 0; h < cache.n_head_kv(); ++h)
            for (int32_t j = 0; j < int32_t(cache.n_rows(il, h)); ++j) all[il][h].push_back(j);
    return all;
}

}  // namespace

CompressStats compress(Press & press, KvStore & cache, const Budget & budget, int64_t reserve) {
    CompressStats st;
    st.observe_s = press.observe_seconds();
    st.rows_before = cache.total_rows();
    st.bytes_before = cache.bytes();
    st.used_before = cache.used_bytes();
    if (cache.total_low_rows() > 0)
        throw Error("press", press.name() + ": the cache already holds demoted rows (compress the full cache)");
    if (budget.demotes() && !demotion_saves(cache.types().k, cache.types().v, budget.demote, cache.head_dim()))
        throw Error("press",
                    std::string("demoting to ") + cache_type_name(budget.demote) + " frees nothing in a cache of " +
                        cache_type_name(cache.types().k) + " K / " + cache_type_name(cache.types().v) +
                        " V rows: demote to a type smaller than both (q4_0 below q8_0 or f16, q8_0 below f16)");
    double t0 = now_seconds();
    Budget rows = budget;  // the budget in rows the method plans for
    if (budget.by_bytes()) {
        const ByteCounts c = byte_counts(cache, budget);
        st.budget_bytes = c.bytes;
        st.rows_high = c.high;
        st.rows_total = c.total;
        rows = Budget::from_tokens(c.total);
        rows.sliding = budget.sliding;
    }
    KeepPlan plan = press.plan(cache, rows);
    if (int(plan.size()) != cache.n_layer()) throw Error("press", press.name() + ": a plan for the wrong layers");
    restrict_sliding_layers(plan, cache, budget);
    KeepPlan high, low;
    if (budget.demotes()) {
        if (!budget.by_bytes()) {  // the method's rows stay, every other row is demoted
            high = std::move(plan);
            plan = every_row(cache);
            restrict_sliding_layers(plan, cache, budget);
        } else if (st.rows_high >= st.rows_total) {
            high = plan;
        } else if (st.rows_high > 0) {
            Budget hb = Budget::from_tokens(st.rows_high);
            hb.sliding = budget.sliding;
            try {
                high = press.plan(cache, hb);
            } catch (const Error &) {
                // fewer rows than the method always keeps (sinks, window): none at the cache types
                high.clear();
            }
        }
        if (high.empty()) high.assign(size_t(cache.n_layer()), std::vector<std::vector<int32_t>>(cache.n_head_kv()));
        restrict_sliding_layers(high, cache, budget);
        low = demoted_rows(high, plan, cache);
    }
    st.plan_s = now_seconds() - t0;
    t0 = now_seconds();
    if (budget.demotes())
        cache.compact_mixed(high, low, budget.demote, reserve);
    else
        cache.compact(plan, reserve);
    st.apply_s = now_seconds() - t0;
    st.rows_after = cache.total_rows();
    st.rows_demoted = cache.total_low_rows();
    st.bytes_after = cache.bytes();
    st.used_after = cache.used_bytes();
    st.kept = cache.rows_per_segment();
    return st;
}

}  // namespace kvlab
