// Engine::eval_batch: several sequences, each on its own cache, through one graph.
#include <algorithm>
#include <memory>
#include <set>

#include "engine/batch_attention.h"
#include "engine/commit_guard.h"
#include "engine/graph_frame.h"
#include "kvlab/engine.h"
#include "kvlab/error.h"

namespace kvlab {

namespace {

void check_batch(const HParams & hp, const std::vector<Engine::BatchItem> & items) {
    std::set<const KvStore *> seen;
    for (size_t i = 0; i < items.size(); ++i) {
        const Engine::BatchItem & it = items[i];
        const std::string who = "batch item " + std::to_string(i) + ": ";
        if (!it.cache || !it.tokens || it.n < 1) throw Error("engine", who + "needs a cache and at least one token");
        if (!seen.insert(it.cache).second) throw Error("engine", who + "its cache is in the batch twice");
        if (it.cache->types() != items[0].cache->types())
            throw Error("engine", who + "its cache's row types differ from the batch's (batch caches of one kind)");
        if (it.cache->lost_rows())
            throw Error("engine", who + "the cache lost rows of its sliding-window layers in a failed evaluation");
        if (int64_t(it.cache->next_pos()) + it.n > hp.n_ctx_train)
            throw Error("engine", who + "exceeds the model's context of " + std::to_string(hp.n_ctx_train) + " tokens");
        for (int64_t j = 0; j < it.n; ++j)
            if (it.tokens[j] < 0 || it.tokens[j] >= hp.n_vocab)
                throw Error("engine", who + "token id " + std::to_string(it.tokens[j]) + " is outside the vocabulary");
    }
}

}  // namespace

void Engine::eval_batch(const std::vector<BatchItem> & items) {
    if (items.empty()) return;
    const HParams & hp = model_.hparams();
    check_batch(hp, items);
    for (const BatchItem & it : items) it.cache->reserve(it.n);  // may reallocate: before any pointer is taken
    std::vector<std::unique_ptr<CommitGuard>> guards;
    std::vector<BatchAttention::Sequence> seqs;
    std::vector<int32_t> tokens, pos, out_ids;
    for (const BatchItem & it : items) {
        KvStore & c = *it.cache;
        BatchAttention::Sequence s;
        s.cache = &c;
        s.n_past = rows_held(c);
        s.row0 = int64_t(tokens.size());
        for (int64_t j = 0; j < it.n; ++j) s.pos.push_back(c.next_pos() + int32_t(j));
        tokens.insert(tokens.end(), it.tokens, it.tokens + it.n);
        pos.insert(pos.end(), s.pos.begin(), s.pos.end());
        out_ids.push_back(int32_t(tokens.size()) - 1);
        // positions recorded now so that the kernels see them; undone if anything below throws
        c.commit(it.n);
        guards.push_back(std::make_unique<CommitGuard>(c));
        guards.back()->add(it.n);
        seqs.push_back(std::move(s));
    }
    const int64_t n = int64_t(tokens.size()), n_out = int64_t(out_ids.size());
    const int n_threads = graph_threads();
    GraphFrame frame(graph_meta_, n, n_out, n_threads);
    BatchAttention attention(frame.ctx.get(), frame.gf, hp, std::move(seqs), frame.scratch);
    ggml_tensor * logits = frame.build(model_, [&attention](int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                                            ggml_tensor *) { return attention(il, q, k, v); });
    if (opts_.on_graph) opts_.on_graph(frame.gf);
    compute(frame, logits, opts_.on_graph != nullptr, n_threads, n, [&] {
        frame.set_inputs(tokens.data(), pos.data(), out_ids.data());
        attention.set_inputs();
    });
    const size_t row = size_t(hp.n_vocab) * sizeof(float);
    for (size_t i = 0; i < items.size(); ++i)
        if (items[i].logits) ggml_backend_tensor_get(logits, items[i].logits, i * row, row);
    for (auto & g : guards) g->release();
    for (const BatchItem & it : items) it.cache->slide();  // sliding-window layers free what no later query sees
}

}  // namespace kvlab
