// DecodePolicy: compression while decoding, by segment (the cache may already be compressed:
// its segments hold different rows), through the engine's DecodeHook. The method scores each
// segment (press::SegmentScorer, found in the registry); the policy chooses when and which rows.
#include "kvlab/decode_policy.h"

#include <algorithm>
#include <numeric>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "press/method.h"
#include "press/policy.h"

namespace kvlab {

namespace {
bool by_threshold(const DecodePolicyOptions & o) {
    return o.params.count("threshold") > 0;
}
}  // namespace

nlohmann::json DecodePolicyOptions::to_json() const {
    nlohmann::json j = {{"method", method}, {"interval", interval}};
    if (!params.empty()) j["params"] = params;
    if (method != "none" && !by_threshold(*this))
        j.update({{"target", target}, {"n_sink", n_sink}, {"window", window}});
    return j;
}

std::string DecodePolicyOptions::label() const {
    if (method == "none") return "";
    const std::string what =
        by_threshold(*this) ? "threshold " + params.at("threshold") : "target " + std::to_string(target);
    return method + " " + what + " interval " + std::to_string(interval);
}

std::vector<std::string> decode_policy_methods() {
    std::vector<std::string> out = {"none"};
    for (const press::Registration * r : press::all_methods())
        if (r->segment) out.push_back(r->info.name);
    return out;
}

int64_t decode_growth(const DecodePolicyOptions & o, int64_t max_tokens) {
    return o.method == "none" ? max_tokens : std::min(o.interval, max_tokens);
}

nlohmann::json DecodePolicy::Stats::to_json() const {
    return {{"compactions", compactions},
            {"rows_dropped", rows_dropped},
            {"max_segment_rows", max_segment_rows},
            {"max_kv_bytes", max_bytes},
            {"seconds", seconds}};
}

struct DecodePolicy::Impl {
    DecodePolicyOptions o;
    std::unique_ptr<press::SegmentScorer> scorer;  // null for none
    std::optional<press::SegmentScorer::Threshold> threshold;
    DecodeHook hook;
    int64_t since = 0;
    Stats st;

    // The hook calls back into this object (its address is fixed once made).
    void wire() {
        if (!scorer) return;
        hook.observer = scorer->observer();
        hook.after_token = [this](KvStore & cache) { after_token(cache); };
        hook.growth = o.interval;
    }

    void after_token(KvStore & cache) {
        scorer->after_token(cache);
        if (++since >= o.interval) {
            since = 0;
            const double t0 = now_seconds();
            compress(cache);
            scorer->compressed(cache);
            st.seconds += now_seconds() - t0;
        }
        for (int il = 0; il < cache.n_layer(); ++il)
            for (int h = 0; h < cache.n_head_kv(); ++h)
                st.max_segment_rows = std::max(st.max_segment_rows, cache.n_rows(il, h) + cache.n_low(il, h));
        st.max_bytes = std::max<uint64_t>(st.max_bytes, cache.bytes());
    }

    // The rows segment (il, h) keeps (ascending row indices).
    std::vector<int32_t> keep(const KvStore & cache, int il, int h) {
        const int64_t n = cache.n_rows(il, h);
        std::vector<int32_t> all(static_cast<size_t>(n));
        std::iota(all.begin(), all.end(), 0);
        if (cache.window(il) > 0) return all;  // a sliding layer keeps its window
        if (threshold) {
            const std::vector<float> score = scorer->score(cache, il, h);
            const std::vector<int32_t> & pos = cache.positions(il, h);
            const int32_t recent = cache.next_pos() - int32_t(threshold->window);
            std::vector<int32_t> out;
            for (int32_t r = 0; r < int32_t(n); ++r)
                if (pos[size_t(r)] >= recent || !(score[size_t(r)] < threshold->value)) out.push_back(r);
            return out;
        }
        if (n <= o.target) return all;
        // the sinks and the window forced, the best of the others by the method's scores
        press::Scores s;
        s.L = n;
        s.n_sink = std::min(o.n_sink, n);
        s.window = std::min(o.window, n - s.n_sink);
        return press::keep_rows(s, scorer->score(cache, il, h), o.target - s.n_sink - s.window);
    }

    void compress(KvStore & cache) {
        KeepPlan plan(size_t(cache.n_layer()), std::vector<std::vector<int32_t>>(size_t(cache.n_head_kv())));
        int64_t dropped = 0;
        for (int il = 0; il < cache.n_layer(); ++il)
            for (int h = 0; h < cache.n_head_kv(); ++h) {
                plan[il][h] = keep(cache, il, h);
                dropped += cache.n_rows(il, h) - int64_t(plan[il][h].size());
            }
        if (dropped == 0) return;
        cache.compact(plan, o.interval);
        ++st.compactions;
        st.rows_dropped += dropped;
    }
};

DecodePolicy::DecodePolicy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
    impl_->wire();
}

DecodePolicy::DecodePolicy(const DecodePolicyOptions & o, const Model & model) : impl_(std::make_unique<Impl>()) {
    Impl & m = *impl_;
    m.o = o;
    if (o.method != "none") {
        const press::Registration * r = press::find_method(o.method);
        if (!r || !r->segment) {
            std::string ok;
            for (const std::string & name : decode_policy_methods()) ok += (ok.empty() ? "" : ", ") + name;
            throw Error("decode-policy", "'" + o.method + "' cannot score while decoding (decoding policies: " + ok +
                                             "; a threshold with kvzap)");
        }
        m.scorer = r->segment(o.params, model);
        m.threshold = m.scorer->threshold();
    }
    if (o.interval < 1) throw Error("decode-policy", "the interval must be at least 1 token");
    if (m.threshold) {
        m.o.window = m.threshold->window;
    } else if (m.scorer) {
        if (o.n_sink < 0 || o.window < 0 || o.target < o.n_sink + o.window + 1)
            throw Error("decode-policy", "the target (" + std::to_string(o.target) +
                                             " rows) must exceed the sinks and the window it keeps (" +
                                             std::to_string(o.n_sink + o.window) + ")");
    }
    m.wire();
}

DecodePolicy::~DecodePolicy() = default;

std::unique_ptr<DecodePolicy> DecodePolicy::another() const {
    auto m = std::make_unique<Impl>();
    m->o = impl_->o;
    m->threshold = impl_->threshold;
    if (impl_->scorer) m->scorer = impl_->scorer->another();
    return std::unique_ptr<DecodePolicy>(new DecodePolicy(std::move(m)));
}

const DecodeHook & DecodePolicy::hook() const {
    return impl_->hook;
}

void DecodePolicy::start(const KvStore & cache) {
    Impl & m = *impl_;
    m.since = m.o.interval;  // the first decoded token compresses: the bound holds from then on
    if (m.scorer) m.scorer->start(cache);
    m.st = Stats{};
}

const DecodePolicy::Stats & DecodePolicy::stats() const {
    return impl_->st;
}

}  // namespace kvlab
