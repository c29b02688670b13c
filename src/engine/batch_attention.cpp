#include "engine/batch_attention.h"

#include "kvlab/error.h"

namespace kvlab {

BatchAttention::BatchAttention(ggml_context * ctx, ggml_cgraph * gf, const HParams & hp, std::vector<Sequence> seqs,
                               kernels::GraphScratch & scratch)
    : ctx_(ctx), hp_(hp), scratch_(scratch), seqs_(std::move(seqs)) {
    KVLAB_ASSERT(!seqs_.empty(), "a batch holds a sequence");
    for (Sequence & s : seqs_) {
        KVLAB_ASSERT(s.cache->types() == seqs_[0].cache->types(), "a batch's stores share their row types");
        KVLAB_ASSERT(s.row0 == rows_, "a batch's sequences follow one another");
        rows_ += int64_t(s.pos.size());
        stores_.push_back(std::make_unique<StoreAttention>(ctx, gf, hp, *s.cache, s.n_past, s.pos, scratch,
                                                           /*use_ggml=*/false, false, false));
    }
}

ggml_tensor * BatchAttention::operator()(int il, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v) {
    // rotated rows (CacheTypes::rotate): Q and K by H_kr, V by H_vr, the output back by H_vr
    const CacheTypes & types = seqs_[0].cache->types();
    const int32_t kr = types.k_rotation(hp_.head_dim), vr = types.v_rotation(hp_.head_dim);
    if (kr > 0) q = stores_[0]->hadamard(q, kr);
    auto batch = std::make_unique<kernels::attn::Batch>();
    std::vector<ggml_tensor *> writes;
    for (size_t i = 0; i < seqs_.size(); ++i) {
        const int64_t n = int64_t(seqs_[i].pos.size()), at = seqs_[i].row0;
        ggml_tensor * ki = ggml_view_3d(ctx_, k, k->ne[0], k->ne[1], n, k->nb[1], k->nb[2], size_t(at) * k->nb[2]);
        ggml_tensor * vi = ggml_view_3d(ctx_, v, v->ne[0], v->ne[1], n, v->nb[1], v->nb[2], size_t(at) * v->nb[2]);
        for (ggml_tensor * w : stores_[i]->write(il, ki, vi, kr, vr)) writes.push_back(w);
        batch->problems.push_back(stores_[i]->problem(il));
        batch->row0.push_back(at);
    }
    ggml_tensor * o =
        kernels::attn::build_batch(ctx_, ggml_is_contiguous(q) ? q : ggml_cont(ctx_, q), batch.get(), writes, scratch_);
    batches_.push_back(std::move(batch));
    o = ggml_reshape_2d(ctx_, o, int64_t(hp_.head_dim) * hp_.n_head, rows_);
    return vr > 0 ? stores_[0]->hadamard(o, vr) : o;
}

void BatchAttention::set_inputs() const {
    for (const auto & s : stores_) s->set_inputs();
}

}  // namespace kvlab
