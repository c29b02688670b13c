// compress(): a press's plan applied to the store (the only place a plan is applied), with its
// statistics; sliding-window layers keep what their next query sees.
#include <algorithm>

#include "kvlab/error.h"
#include "kvlab/press.h"
#include "kvlab/sys.h"

namespace kvlab {

nlohmann::json CompressStats::to_json() const {
    return {{"plan_s", plan_s},
            {"observe_s", observe_s},
            {"apply_s", apply_s},
            {"seconds", seconds()},
            {"rows_before", rows_before},
            {"rows_after", rows_after},
            {"bytes_before", bytes_before},
            {"bytes_after", bytes_after},
            {"used_before", used_before},
            {"used_after", used_after},
            {"kept", kept}};
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

}  // namespace

CompressStats compress(Press & press, KvStore & cache, const Budget & budget, int64_t reserve) {
    CompressStats st;
    st.observe_s = press.observe_seconds();
    st.rows_before = cache.total_rows();
    st.bytes_before = cache.bytes();
    st.used_before = cache.used_bytes();
    double t0 = now_seconds();
    KeepPlan plan = press.plan(cache, budget);
    if (int(plan.size()) == cache.n_layer()) restrict_sliding_layers(plan, cache, budget);
    st.plan_s = now_seconds() - t0;
    t0 = now_seconds();
    cache.compact(plan, reserve);
    st.apply_s = now_seconds() - t0;
    st.rows_after = cache.total_rows();
    st.bytes_after = cache.bytes();
    st.used_after = cache.used_bytes();
    st.kept = cache.rows_per_segment();
    return st;
}

}  // namespace kvlab
