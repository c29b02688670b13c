#include "model/packed_product.h"

#include "ggml-backend.h"

namespace kvlab::gemm_common {

namespace {

void op_pack(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const ggml_tensor * x = dst->src[0];
    static_cast<const PackedProduct *>(userdata)->pack(static_cast<const float *>(x->data), x->ne[0], x->ne[1],
                                                       int64_t(x->nb[1] / sizeof(float)),
                                                       static_cast<uint8_t *>(dst->data), ith, nth);
}

void op_product(ggml_tensor * dst, int ith, int nth, void * userdata) {
    static_cast<const PackedProduct *>(userdata)->product(dst->src[0], static_cast<const uint8_t *>(dst->src[1]->data),
                                                          dst->src[2]->ne[1], static_cast<float *>(dst->data),
                                                          int64_t(dst->nb[1] / sizeof(float)), ith, nth);
}

}  // namespace

ggml_tensor * pack_node(ggml_context * ctx, ggml_tensor * x, size_t packed_bytes, const PackedProduct & k) {
    ggml_tensor * src[1] = {x};
    return ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(packed_bytes), 1, 1, 1, src, 1, op_pack, GGML_N_TASKS_MAX,
                          const_cast<PackedProduct *>(&k));
}

ggml_tensor * product_node(ggml_context * ctx, ggml_tensor * w, ggml_tensor * packed, ggml_tensor * x,
                           const PackedProduct & k) {
    ggml_tensor * args[3] = {w, packed, x};
    return ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, args, 3, op_product, GGML_N_TASKS_MAX,
                          const_cast<PackedProduct *>(&k));
}

ggml_tensor * packed_product(ggml_context * ctx, ggml_tensor * w, ggml_tensor * x, size_t packed_bytes,
                             const PackedProduct & k) {
    return product_node(ctx, w, pack_node(ctx, x, packed_bytes, k), x, k);
}

bool plain_operands(const ggml_tensor * w, const ggml_tensor * x, int64_t k_block) {
    return ggml_n_dims(w) == 2 && w->ne[0] % k_block == 0 && w->buffer && ggml_backend_buffer_is_host(w->buffer) &&
           !w->extra && x->type == GGML_TYPE_F32 && x->ne[2] == 1 && x->ne[3] == 1 && x->ne[0] == w->ne[0] &&
           x->nb[0] == sizeof(float) && x->ne[1] >= 1;
}

}  // namespace kvlab::gemm_common
