// KVzip (docs/methods.md; NeurIPS 2025, arXiv 2505.23416; kvpress KVzipPress): query-agnostic.
// Each KV pair is worth the most attention the model pays it while it repeats the context:
// chunk by chunk, a repeat prompt, the chat template's end of the user turn and the chunk
// itself are prefilled on top of the context (scoring passes, rolled back at once); every
// layer's repeat queries attend to a restricted key set (sinks, the chunk's rows, the repeat
// rows; causal inside the repeat block) and a chunk row scores the max over those queries
// and the query heads of its GQA group. One global threshold over every (layer, KV head,
// row) score: layers and heads keep different counts, and the rest is freed (kvpress only
// masks them). `layerwise`: the same count per layer.
#include <algorithm>
#include <numeric>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "press/method.h"

namespace kvlab::press {
namespace {

class KvzipPress : public Press {
public:
    KvzipPress(const Params & p, const Model & m)
        : hp_(m.hparams()),
          n_threads_(m.n_threads()),
          chunk_(p.get_int("chunk")),
          n_sink_(p.get_int("n_sink")),
          overlap_(p.get_int("overlap")),
          layerwise_(p.get_bool("layerwise")),
          prompt_(p.get_string("prompt")),
          prompt_next_(p.get_string("prompt_next")) {
        if (chunk_ < 1) throw Error("press", "kvzip: chunk must be at least 1");
        if (n_sink_ < 1) throw Error("press", "kvzip: n_sink must be at least 1 (every head keeps its sinks)");
        if (overlap_ < 0) throw Error("press", "kvzip: overlap cannot be negative");
    }

    bool has_scoring_passes() const override { return true; }

    std::vector<ScoringPass> scoring_passes(const KvStore & cache, const std::vector<int32_t> & context,
                                            const Tokenizer & tok) override {
        L_ = int64_t(context.size());
        if (!cache.uniform() || cache.n_rows(0, 0) != L_ || cache.next_pos() != L_)
            throw Error("press", "kvzip scores a freshly prefilled context");
        best_.assign(hp_.n_layer, std::vector<std::vector<float>>(hp_.n_head_kv, std::vector<float>(size_t(L_), 0.0f)));
        const std::vector<int32_t> suffix = tok.user_turn_suffix();
        passes_.clear();
        for (int64_t c0 = std::min(n_sink_, L_); c0 < L_; c0 += chunk_) {
            auto pass = std::make_unique<Pass>();
            pass->c0 = c0;
            pass->c1 = std::min(L_, c0 + chunk_);
            pass->tokens = tok.encode(c0 == std::min(n_sink_, L_) ? prompt_ : prompt_next_, false, true);
            if (c0 > std::min(n_sink_, L_))  // "... starting with" the previous chunk's last tokens
                pass->tokens.insert(pass->tokens.end(), context.begin() + std::max<int64_t>(0, c0 - overlap_),
                                    context.begin() + c0);
            pass->tokens.insert(pass->tokens.end(), suffix.begin(), suffix.end());
            pass->tokens.insert(pass->tokens.end(), context.begin() + c0, context.begin() + pass->c1);
            pass->seen.assign(hp_.n_layer, 0);
            Pass * ps = pass.get();
            pass->obs.on_queries = [this, ps, &cache](int il, int64_t tok0, int64_t n, const float * q) {
                observe(*ps, cache, il, tok0, n, q);
            };
            passes_.push_back(std::move(pass));
        }
        std::vector<ScoringPass> out;
        for (const auto & p : passes_) out.push_back({p->tokens, &p->obs});
        return out;
    }

    KeepPlan plan(const KvStore & cache, const Budget & budget) override {
        if (cache.n_rows(0, 0) != L_ || L_ == 0) throw Error("press", "kvzip: the context was not scored");
        for (const auto & p : passes_)
            for (int64_t seen : p->seen)
                if (seen != int64_t(p->tokens.size()))
                    throw Error("press", "kvzip: a scoring pass was not observed to its end");
        const int64_t L = L_, sink = std::min(n_sink_, L);
        const int64_t B = std::min(budget.per_layer(L), L);
        if (B < sink)
            throw Error("press", "kvzip: a budget of " + std::to_string(B) + " rows per layer is below the " +
                                     std::to_string(sink) + " sinks every head keeps");
        const int n_layer = hp_.n_layer, n_head = hp_.n_head_kv;
        std::vector<std::vector<std::vector<char>>> keep(
            n_layer, std::vector<std::vector<char>>(n_head, std::vector<char>(size_t(L), 0)));
        for (auto & layer : keep)
            for (auto & head : layer) std::fill(head.begin(), head.begin() + sink, 1);
        // candidates: (layer, head, row) past the sinks; ties go to the lower index
        const auto select = [&](const std::vector<int> & layers, int64_t n_pick) {
            std::vector<int64_t> idx;
            for (int il : layers)
                for (int h = 0; h < n_head; ++h)
                    for (int64_t j = sink; j < L; ++j) idx.push_back((int64_t(il) * n_head + h) * L + j);
            n_pick = std::min<int64_t>(n_pick, int64_t(idx.size()));
            const auto score = [&](int64_t x) { return best_[x / L / n_head][(x / L) % n_head][x % L]; };
            std::nth_element(idx.begin(), idx.begin() + n_pick, idx.end(), [&](int64_t a, int64_t b) {
                return score(a) > score(b) || (score(a) == score(b) && a < b);
            });
            for (int64_t i = 0; i < n_pick; ++i) keep[idx[i] / L / n_head][(idx[i] / L) % n_head][idx[i] % L] = 1;
        };
        const int64_t per_layer = (B - sink) * n_head;  // rows past the sinks a layer keeps on average
        // the layers the budget compresses (a sliding-window layer keeps its window unless
        // budget.sliding): the global threshold is over theirs only
        const std::vector<int> layers = compressed_layers(cache, budget);
        if (layerwise_) {
            for (int il : layers) select({il}, per_layer);
        } else {
            select(layers, per_layer * int64_t(layers.size()));
        }
        KeepPlan plan(n_layer, std::vector<std::vector<int32_t>>(n_head));
        for (int il = 0; il < n_layer; ++il)
            for (int h = 0; h < n_head; ++h)
                for (int64_t j = 0; j < L; ++j)
                    if (keep[il][h][j]) plan[il][h].push_back(int32_t(j));
        return plan;
    }

private:
    struct Pass {
        int64_t c0 = 0, c1 = 0;  // the context rows it repeats
        std::vector<int32_t> tokens;
        std::vector<int64_t> seen;  // [layer] query rows observed
        QueryObserver obs;
    };

    // One layer's repeat queries of tokens [tok0, tok0 + n) of the pass, while the store
    // holds the context and the pass's rows up to tok0 + n.
    void observe(Pass & p, const KvStore & cache, int il, int64_t tok0, int64_t n, const float * q) {
        const int group = hp_.n_gqa(), d = hp_.head_dim;
        const int64_t sink = std::min(n_sink_, L_), n_chunk = p.c1 - p.c0, n_fixed = sink + n_chunk;
        const int64_t n_rep = tok0 + n;
        const int64_t q_stride = int64_t(hp_.n_head) * d;
        // the restricted keys of every head: sinks, the chunk's rows, the repeat rows so far,
        // transposed once for all the blocks of queries
        std::vector<kernels::TransposedKeys> k;
        for (int h = 0; h < hp_.n_head_kv; ++h) {
            std::vector<float> kh = cache.read_k(il, h, 0, sink);
            for (const auto & part : {cache.read_k(il, h, p.c0, n_chunk), cache.read_k(il, h, L_, n_rep)})
                kh.insert(kh.end(), part.begin(), part.end());
            k.emplace_back(kh.data(), n_fixed + n_rep, d);
        }
        // tasks: (head, block of query rows), each with its own maxima, merged after
        constexpr int64_t rows_per_task = 64;
        const int64_t n_blocks = (n + rows_per_task - 1) / rows_per_task;
        std::vector<std::vector<float>> best(size_t(hp_.n_head_kv * n_blocks));
        parallel_for(hp_.n_head_kv * n_blocks, n_threads_, [&](int64_t t) {
            const int64_t h = t / n_blocks, r0 = (t % n_blocks) * rows_per_task, nr = std::min(rows_per_task, n - r0);
            best[t].assign(size_t(n_fixed), 0.0f);
            kernels::restricted_max_attention(q + r0 * q_stride + h * group * d, q_stride, nr, tok0 + r0, k[h], n_fixed,
                                              n_rep, group, best[t].data());
        });
        for (int64_t t = 0; t < int64_t(best.size()); ++t) {
            std::vector<float> & out = best_[il][t / n_blocks];
            for (int64_t j = 0; j < n_chunk; ++j) out[p.c0 + j] = std::max(out[p.c0 + j], best[t][sink + j]);
        }
        p.seen[il] += n;
    }

    HParams hp_;
    int n_threads_;
    int64_t chunk_, n_sink_, overlap_;
    bool layerwise_;
    std::string prompt_, prompt_next_;
    int64_t L_ = 0;
    std::vector<std::unique_ptr<Pass>> passes_;
    std::vector<std::vector<std::vector<float>>> best_;  // [layer][head][L] max attention while repeating
};

const MethodRegistrar reg([] {
    Registration r;
    r.info = MethodInfo{
        "kvzip",
        "query-agnostic: the most attention each pair gets while the model repeats the context (scoring passes on "
        "top of the cache); one global threshold, layers and heads keep different counts",
        {{"chunk", "2048", "context rows per repeat pass"},
         {"n_sink", "4", "first rows every head keeps"},
         {"overlap", "8", "tokens of the previous chunk after the later chunks' prompt"},
         {"layerwise", "false", "the same count per layer instead of one global threshold"},
         {"prompt", "\n\nRepeat the previous context exactly.", "the first chunk's repeat prompt"},
         {"prompt_next", "\n\nRepeat the part of the previous context exactly, starting with",
          "the later chunks' repeat prompt (followed by the previous chunk's last `overlap` tokens)"}},
        false,
        false};
    r.make = [](const Params & p, const Model & m) -> std::unique_ptr<Press> {
        return std::make_unique<KvzipPress>(p, m);
    };
    return r;
});

}  // namespace
}  // namespace kvlab::press
