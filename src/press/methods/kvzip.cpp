// KVzip (docs/methods.md; NeurIPS 2025, arXiv 2505.23416; kvpress KVzipPress): query-agnostic.
// Each KV pair is worth the most attention the model pays it while it repeats the context:
// chunk by chunk, a repeat prompt, the chat template's end of the user turn and the chunk
// itself are prefilled on top of the context (scoring passes, rolled back at once); every
// layer's repeat queries attend to a restricted key set (sinks, the chunk's rows, the repeat
// rows; causal inside the repeat block) and a chunk row scores the max over those queries
// and the query heads of its GQA group. One global threshold over every (layer, KV head,
// row) score: layers and heads keep different counts, and the rest is freed (kvpress only
// masks them). `layerwise`: the same count per layer. `plus` (KVzip+, kvpress
// kvzip_plus_normalization; the target KVzap learns): each probability is divided by the norm
// of the hidden state entering the attention at the repeat query and multiplied by the norm of
// the key's value through the query head's block of W_o, before the maxima.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/scoring.h"
#include "kvlab/error.h"
#include "press/eigen.h"
#include "press/method.h"
#include "press/policy.h"

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
          plus_(p.get_bool("plus")),
          model_(m),
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
        if (plus_ && grams_.empty())
            for (int il = 0; il < hp_.n_layer; ++il) grams_.push_back(output_grams(model_, il));
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
            if (plus_) {
                pass->row_w.assign(hp_.n_layer, std::vector<float>(pass->tokens.size(), 0.0f));
                pass->key_w.assign(hp_.n_layer, {});
                pass->obs.on_hidden = [this, ps](int il, int64_t tok0, int64_t n, const float * x) {
                    for (int64_t r = 0; r < n; ++r) {
                        double ss = 0.0;
                        for (int e = 0; e < hp_.n_embd; ++e)
                            ss += double(x[r * hp_.n_embd + e]) * x[r * hp_.n_embd + e];
                        ps->row_w[il][size_t(tok0 + r)] = float(1.0 / std::max(std::sqrt(ss), 1e-30));
                    }
                };
            }
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
        // one global threshold over the compressed layers (a sliding-window layer keeps its
        // window unless budget.sliding); `layerwise`: one per layer
        const Scores s = scores();
        const std::vector<int> layers = compressed_layers(cache, budget);
        if (!layerwise_) return select_global(s, B, layers);
        KeepPlan plan = select_global(s, B, {});
        for (int il : layers) plan[size_t(il)] = select_global(s, B, {il})[size_t(il)];
        return plan;
    }

    RowScores last_scores() const override {
        const Scores s = scores();
        RowScores r{s.s, std::vector<char>(size_t(s.L), 0)};
        for (int64_t j = 0; j < s.L; ++j) r.forced[size_t(j)] = s.is_forced(j);
        return r;
    }

private:
    struct Pass {
        int64_t c0 = 0, c1 = 0;  // the context rows it repeats
        std::vector<int32_t> tokens;
        std::vector<int64_t> seen;  // [layer] query rows observed
        QueryObserver obs;
        // KVzip+: [layer][pass token] 1 / ||x||; [layer][head][g][fixed key] ||W_o,g v|| (made on
        // the layer's first block of queries: the fixed keys are in the store by then)
        std::vector<std::vector<float>> row_w;
        std::vector<std::vector<std::vector<float>>> key_w;
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
        if (plus_ && p.key_w[il].empty()) p.key_w[il] = value_weights(cache, il, p.c0, n_chunk);
        // tasks: (head, block of query rows), each with its own maxima, merged after
        constexpr int64_t rows_per_task = 64;
        const int64_t n_blocks = (n + rows_per_task - 1) / rows_per_task;
        std::vector<std::vector<float>> best(size_t(hp_.n_head_kv * n_blocks));
        parallel_for(hp_.n_head_kv * n_blocks, n_threads_, [&](int64_t t) {
            const int64_t h = t / n_blocks, r0 = (t % n_blocks) * rows_per_task, nr = std::min(rows_per_task, n - r0);
            best[t].assign(size_t(n_fixed), 0.0f);
            kernels::restricted_max_attention(
                q + r0 * q_stride + h * group * d, q_stride, nr, tok0 + r0, k[h], n_fixed, n_rep, group, best[t].data(),
                plus_ ? p.row_w[il].data() + tok0 + r0 : nullptr, plus_ ? p.key_w[il][h].data() : nullptr);
        });
        for (int64_t t = 0; t < int64_t(best.size()); ++t) {
            std::vector<float> & out = best_[il][t / n_blocks];
            for (int64_t j = 0; j < n_chunk; ++j) out[p.c0 + j] = std::max(out[p.c0 + j], best[t][sink + j]);
        }
        p.seen[il] += n;
    }

    // ||W_o,g v_j|| of the fixed keys (sinks, then the chunk's rows) of every head: [head][g * n_fixed + j].
    std::vector<std::vector<float>> value_weights(const KvStore & cache, int il, int64_t c0, int64_t n_chunk) const {
        const int group = hp_.n_gqa(), d = hp_.head_dim;
        const int64_t sink = std::min(n_sink_, L_), n_fixed = sink + n_chunk;
        std::vector<std::vector<float>> w(hp_.n_head_kv, std::vector<float>(size_t(group * n_fixed)));
        for (int h = 0; h < hp_.n_head_kv; ++h) {
            std::vector<float> v = cache.read_v(il, h, 0, sink);
            const std::vector<float> vc = cache.read_v(il, h, c0, n_chunk);
            v.insert(v.end(), vc.begin(), vc.end());
            using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
            const Eigen::Map<const RowMajor> V(v.data(), n_fixed, d);
            for (int g = 0; g < group; ++g) {
                const Eigen::Map<const RowMajor> G(grams_[il].data() + size_t(h * group + g) * d * d, d, d);
                const RowMajor VG = V * G;  // ||W_o,g v||^2 = v^T G v, row by row
                const Eigen::VectorXf sq = (VG.array() * V.array()).rowwise().sum();
                for (int64_t j = 0; j < n_fixed; ++j) w[h][size_t(g * n_fixed + j)] = std::sqrt(std::max(sq[j], 0.0f));
            }
        }
        return w;
    }

    Scores scores() const {
        Scores s;
        s.L = L_;
        s.n_sink = std::min(n_sink_, L_);
        s.s = best_;
        return s;
    }

    HParams hp_;
    int n_threads_;
    int64_t chunk_, n_sink_, overlap_;
    bool layerwise_, plus_;
    const Model & model_;
    std::vector<std::vector<float>> grams_;  // KVzip+: [layer] output_grams
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
         {"plus", "false",
          "KVzip+ (kvpress kvzip_plus_normalization): each probability divided by the norm of the hidden state "
          "entering the attention at the repeat query and multiplied by the norm of the value through the query "
          "head's block of W_o"},
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
