// DecodePolicy: compression while decoding, by segment (the cache may already be compressed:
// its segments hold different rows), through the engine's DecodeHook.
#include "kvlab/decode_policy.h"

#include <algorithm>
#include <numeric>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "kvlab/surrogate.h"
#include "kvlab/sys.h"
#include "press/method.h"

namespace kvlab {

nlohmann::json DecodePolicyOptions::to_json() const {
    nlohmann::json j = {{"method", method}, {"interval", interval}};
    if (method == "kvzap") {
        j["params"] = params;
    } else if (method != "none") {
        j.update({{"target", target}, {"n_sink", n_sink}, {"window", window}});
    }
    return j;
}

std::string DecodePolicyOptions::label() const {
    if (method == "none") return "";
    const auto it = params.find("threshold");
    const std::string what = method == "kvzap" ? "threshold " + (it == params.end() ? std::string("?") : it->second)
                                               : "target " + std::to_string(target);
    return method + " " + what + " interval " + std::to_string(interval);
}

std::vector<std::string> decode_policy_methods() {
    return {"none", "knorm", "keydiff", "streaming_llm", "tova", "kvzap"};
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
    HParams hp;
    std::shared_ptr<const Surrogate> zap;
    float threshold = 0.0f;
    QueryObserver obs;
    DecodeHook hook;
    int64_t since = 0;
    std::vector<std::vector<float>> pending;  // kvzap: [layer][head] the last decoded token's predictions
    // tova: the last decoded token's queries [layer][n_head * head_dim], and those of the tokens
    // decoded since the last compression with their positions
    std::vector<std::vector<float>> pending_q;
    std::vector<std::pair<int32_t, std::vector<std::vector<float>>>> queries;
    // kvzap: [layer][head] (position, predicted log score) of the generated rows still held
    std::vector<std::vector<std::vector<std::pair<int32_t, float>>>> generated;
    Stats st;

    void after_token(KvStore & cache) {
        if (zap) {
            const int32_t pos = cache.next_pos() - 1;
            for (int il = 0; il < hp.n_layer; ++il)
                for (int h = 0; h < hp.n_head_kv; ++h) generated[il][h].emplace_back(pos, pending[il][h]);
        }
        if (o.method == "tova") queries.emplace_back(cache.next_pos() - 1, pending_q);
        if (++since >= o.interval) {
            since = 0;
            const double t0 = now_seconds();
            compress(cache);
            queries.clear();
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
        const std::vector<int32_t> & pos = cache.positions(il, h);
        if (zap) {
            auto & gen = generated[il][h];
            const int32_t recent = cache.next_pos() - int32_t(o.window);
            std::vector<int32_t> out;
            std::vector<std::pair<int32_t, float>> still;
            size_t g = 0;
            for (int32_t r = 0; r < int32_t(n); ++r) {
                while (g < gen.size() && gen[g].first < pos[size_t(r)]) ++g;
                const bool scored = g < gen.size() && gen[g].first == pos[size_t(r)];
                if (scored && pos[size_t(r)] < recent && gen[g].second < threshold) continue;
                out.push_back(r);
                if (scored) still.push_back(gen[g]);
            }
            gen = std::move(still);
            return out;
        }
        if (n <= o.target) return all;
        std::vector<float> score(static_cast<size_t>(n));
        if (o.method == "streaming_llm") {
            for (int64_t r = 0; r < n; ++r) score[size_t(r)] = float(pos[size_t(r)]);
        } else if (o.method == "tova") {
            score = tova_scores(cache, il, h);
        } else {
            const std::vector<float> k = cache.read_k(il, h);
            score = o.method == "knorm" ? kernels::negative_key_norms(k.data(), n, cache.head_dim())
                                        : kernels::keydiff(k.data(), n, cache.head_dim());
        }
        const int64_t sink = std::min(o.n_sink, n), win = std::min(o.window, n - sink);
        std::vector<int32_t> out;
        for (int32_t r = 0; r < int32_t(sink); ++r) out.push_back(r);
        const int64_t n_cand = n - sink - win;
        for (int32_t i : kernels::top_rows(score.data() + sink, n_cand, o.target - sink - win))
            out.push_back(int32_t(sink) + i);
        for (int32_t r = int32_t(n - win); r < int32_t(n); ++r) out.push_back(r);
        std::sort(out.begin(), out.end());
        return out;
    }

    // Attention of segment (il, h)'s rows from the queries decoded since the last compression,
    // averaged over the queries that saw each row and the group's query heads.
    std::vector<float> tova_scores(const KvStore & cache, int il, int h) const {
        const std::vector<int32_t> & pos = cache.positions(il, h);
        const int64_t n = int64_t(pos.size());
        const int group = hp.n_gqa(), d = hp.head_dim;
        const std::vector<float> k = cache.read_k(il, h);
        std::vector<float> sum(size_t(n), 0.0f), count(size_t(n), 0.0f);
        for (const auto & [p, q] : queries) {
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

DecodePolicy::DecodePolicy(const DecodePolicyOptions & o, const Model & model, std::shared_ptr<const Surrogate> scorer)
    : impl_(std::make_unique<Impl>()) {
    Impl & m = *impl_;
    m.o = o;
    m.hp = model.hparams();
    const auto methods = decode_policy_methods();
    if (std::find(methods.begin(), methods.end(), o.method) == methods.end())
        throw Error("decode-policy", "unknown decoding policy '" + o.method +
                                         "' (none, knorm, keydiff, streaming_llm, tova, kvzap with a threshold)");
    if (o.interval < 1) throw Error("decode-policy", "the interval must be at least 1 token");
    if (o.method == "kvzap") {
        // the method's own parameters, checked as `--param` is; n_sink does not apply (the
        // context's rows stay)
        if (o.params.count("n_sink"))
            throw Error("decode-policy", "kvzap while decoding keeps every context row: no n_sink");
        const press::Params p("kvzap", press::find_method("kvzap")->info.params, o.params);
        if (p.get_string("threshold").empty())
            throw Error("decode-policy", "kvzap while decoding needs a threshold (--decode-param threshold=T)");
        m.threshold = float(p.get_float("threshold"));
        m.o.window = p.get_int("window");
        if (m.o.window < 0) throw Error("decode-policy", "the window cannot be negative");
        m.zap = scorer ? std::move(scorer)
                       : std::make_shared<const Surrogate>(
                             scorer_for(model, p.get_string("scorer"), Surrogate::kind_of(p.get_string("kind"))));
        m.pending.assign(size_t(m.hp.n_layer), std::vector<float>(size_t(m.hp.n_head_kv)));
        m.obs.on_hidden = [&m](int il, int64_t, int64_t n, const float * x) {
            m.zap->predict(il, x + (n - 1) * m.hp.n_embd, 1, m.pending[size_t(il)].data());
        };
        m.hook.observer = &m.obs;
    } else if (o.method != "none") {
        if (!o.params.empty()) throw Error("decode-policy", o.method + " while decoding takes no --param");
        if (o.n_sink < 0 || o.window < 0 || o.target < o.n_sink + o.window + 1)
            throw Error("decode-policy", "the target (" + std::to_string(o.target) +
                                             " rows) must exceed the sinks and the window it keeps (" +
                                             std::to_string(o.n_sink + o.window) + ")");
    }
    if (o.method == "tova") {
        m.pending_q.assign(size_t(m.hp.n_layer), std::vector<float>(size_t(m.hp.n_head) * m.hp.head_dim));
        m.obs.on_queries = [&m](int il, int64_t, int64_t n, const float * q) {
            const size_t per_row = m.pending_q[size_t(il)].size();
            std::copy_n(q + (n - 1) * int64_t(per_row), per_row, m.pending_q[size_t(il)].begin());
        };
        m.hook.observer = &m.obs;
    }
    if (o.method != "none") {
        m.hook.after_token = [&m](KvStore & cache) { m.after_token(cache); };
        m.hook.growth = o.interval;
    }
}

DecodePolicy::~DecodePolicy() = default;

const DecodeHook & DecodePolicy::hook() const {
    return impl_->hook;
}

void DecodePolicy::start(const KvStore & cache) {
    Impl & m = *impl_;
    m.since = m.o.interval;  // the first decoded token compresses: the bound holds from then on
    m.generated.assign(size_t(cache.n_layer()),
                       std::vector<std::vector<std::pair<int32_t, float>>>(size_t(cache.n_head_kv())));
    m.queries.clear();
    m.st = Stats{};
}

std::shared_ptr<const Surrogate> DecodePolicy::scorer() const {
    return impl_->zap;
}

const DecodePolicy::Stats & DecodePolicy::stats() const {
    return impl_->st;
}

}  // namespace kvlab
