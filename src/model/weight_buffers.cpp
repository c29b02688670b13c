#include "model/weight_buffers.h"

#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"

namespace kvlab {

namespace {

// The CPU backend's extra buffer types (null-terminated list from the CPU registry).
std::vector<ggml_backend_buffer_type_t> extra_buffer_types(ggml_backend_dev_t dev) {
    std::vector<ggml_backend_buffer_type_t> out;
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    using get_fn = ggml_backend_buffer_type_t * (*)(ggml_backend_dev_t);
    auto get = reinterpret_cast<get_fn>(ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"));
    if (!get) return out;
    for (ggml_backend_buffer_type_t * b = get(dev); b && *b; ++b) out.push_back(*b);
    return out;
}

// Whether the device runs a matrix product with weight w placed in buft (a product with a
// 512-row float batch; the dummy buffer only carries the type, as libllama checks it).
bool supports_matmul(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, const ggml_tensor * w) {
    if (ggml_n_dims(w) != 2) return false;
    ggml_init_params ip = {4 * ggml_tensor_overhead(), nullptr, true};
    ggml_context_ptr ctx(ggml_init(ip));
    ggml_tensor * wt = ggml_new_tensor_2d(ctx.get(), w->type, w->ne[0], w->ne[1]);
    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, w->ne[0], 512);
    ggml_tensor * op = ggml_mul_mat(ctx.get(), wt, x);
    ggml_backend_buffer_ptr dummy(ggml_backend_buft_alloc_buffer(buft, 0));
    wt->buffer = dummy.get();
    const bool ok = ggml_backend_dev_supports_op(dev, op);
    wt->buffer = nullptr;
    return ok;
}

// Weights are read end to end on every token: in 2 MiB pages (asked before they are written).
void advise_huge_pages(ggml_backend_buffer_t buf) {
    kvlab::advise_huge_pages(ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf));
}

}  // namespace

WeightBuffers allocate_weights(ggml_context * ctx, ggml_backend_t backend, bool repack,
                               const std::function<bool(const ggml_tensor *)> & may_repack) {
    WeightBuffers wb;
    uint64_t need = 0;
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) need += ggml_nbytes(t);
    require_memory(need, "the model's weights");
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (repack && dev) {
        for (ggml_backend_buffer_type_t buft : extra_buffer_types(dev)) {
            std::vector<ggml_tensor *> mine;
            size_t size = 0;
            const size_t align = ggml_backend_buft_get_alignment(buft);
            for (ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t))
                if (!t->data && may_repack(t) && supports_matmul(dev, buft, t)) {
                    mine.push_back(t);
                    size += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
                }
            if (mine.empty()) continue;
            wb.repacked.reset(ggml_backend_buft_alloc_buffer(buft, size));
            if (!wb.repacked) throw Error("backend", "could not allocate the repacked weight buffer");
            advise_huge_pages(wb.repacked.get());
            ggml_backend_buffer_set_usage(wb.repacked.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
            ggml_tallocr talloc = ggml_tallocr_new(wb.repacked.get());
            for (ggml_tensor * t : mine)
                if (ggml_tallocr_alloc(&talloc, t) != GGML_STATUS_SUCCESS)
                    throw Error("backend", std::string("could not place ") + t->name + " in the repacked buffer");
            wb.n_repacked = int(mine.size());
            break;  // one extra buffer type is enough: the first that takes any tensor
        }
    }
    // the rest (every tensor still without data) in one plain host buffer
    wb.plain.reset(ggml_backend_alloc_ctx_tensors(ctx, backend));
    if (!wb.plain) throw Error("backend", "could not allocate the weight buffer");
    advise_huge_pages(wb.plain.get());
    ggml_backend_buffer_set_usage(wb.plain.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    return wb;
}

}  // namespace kvlab
