// One evaluation's graph (Engine::eval, Engine::eval_batch): its context on the engine's
// metadata storage, the graph, the inputs the architecture reads and the scratch of kvlab's
// nodes, for n tokens of which n_out give logits.
#pragma once

#include <cstdint>
#include <vector>

#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "kernels/scratch.h"
#include "kvlab/error.h"
#include "kvlab/model.h"
#include "model/arch.h"

namespace kvlab {

struct GraphFrame {
    static constexpr size_t k_max_nodes = 8192;
    static size_t meta_bytes() {
        return ggml_tensor_overhead() * k_max_nodes + ggml_graph_overhead_custom(k_max_nodes, false);
    }

    ggml_context_ptr ctx;
    ggml_cgraph * gf = nullptr;
    GraphInputs in;
    kernels::GraphScratch scratch;

    GraphFrame(std::vector<uint8_t> & meta, int64_t n, int64_t n_out, int n_threads)
        : ctx(open(meta)), gf(ggml_new_graph_custom(ctx.get(), k_max_nodes, false)), scratch(ctx.get(), n_threads) {
        in.tokens = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);       // I32 [n]
        in.pos = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n);          // I32 [n]
        in.out_ids = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I32, n_out);  // I32 [n_out]
        for (ggml_tensor * t : {in.tokens, in.pos, in.out_ids}) ggml_set_input(t);
    }

    // The model's graph over the attention: its logits (an output), the scratch sized.
    ggml_tensor * build(const Model & model, const AttentionFn & attention) {
        ggml_tensor * logits = model.arch().build_graph(
            GraphContext{ctx.get(), gf, model.hparams(), model.products(), in, attention, &model.panels(), scratch});
        ggml_set_output(logits);
        scratch.finish();
        return logits;
    }

    // After allocation: the tokens, their positions and the rows whose logits are computed.
    void set_inputs(const int32_t * tokens, const int32_t * pos, const int32_t * out_ids) const {
        ggml_backend_tensor_set(in.tokens, tokens, 0, ggml_nbytes(in.tokens));
        ggml_backend_tensor_set(in.pos, pos, 0, ggml_nbytes(in.pos));
        ggml_backend_tensor_set(in.out_ids, out_ids, 0, ggml_nbytes(in.out_ids));
    }

private:
    static ggml_context * open(std::vector<uint8_t> & meta) {
        ggml_context * c = ggml_init({meta.size(), meta.data(), true});
        if (!c) throw Error("engine", "could not create the graph context");
        return c;
    }
};

}  // namespace kvlab
