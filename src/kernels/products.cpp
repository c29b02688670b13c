#include "kernels/products.h"

#include <algorithm>
#include <vector>

#include "ggml-backend.h"
#include "kvlab/error.h"

namespace kvlab {

Products default_products() {
    if (amx_available()) return Products::amx;
    return vnni_available() ? Products::vnni : Products::ggml;
}

Products parse_products(const std::string & name) {
    if (name == "ggml") return Products::ggml;
    if (name == "auto") return default_products();
    if (name == "amx") {
        if (!amx_available())
            throw Error("cli",
                        "--products amx: this CPU or kernel has no AMX-INT8 tiles (or kvlab was built without "
                        "them); use auto, vnni or ggml");
        return Products::amx;
    }
    if (name == "vnni") {
        if (!vnni_available())
            throw Error("cli",
                        "--products vnni: this CPU has no AVX-512 VNNI and BITALG (or kvlab was built without "
                        "them); use auto or ggml");
        return Products::vnni;
    }
    throw Error("cli", "--products takes auto, ggml, amx or vnni, got '" + name + "'");
}

const char * products_name(Products p) {
    switch (p) {
        case Products::amx:
            return "amx";
        case Products::vnni:
            return "vnni";
        default:
            return "ggml";
    }
}

bool amx_available() {
    return kernels::amx_kernel().available();
}

bool vnni_available() {
    return kernels::vnni_kernel().available();
}

}  // namespace kvlab

namespace kvlab::kernels {

namespace {

// The kernels are static objects: the graph nodes keep their addresses as userdata.
const ProductKernel & of(void * userdata) {
    return *static_cast<const ProductKernel *>(userdata);
}

void * userdata(const ProductKernel & k) {
    return const_cast<ProductKernel *>(&k);
}

int64_t row_stride(const ggml_tensor * t) {  // floats between rows
    return int64_t(t->nb[1] / sizeof(float));
}

void run_product(const ProductKernel & k, const ggml_tensor * w, const uint8_t * packed, int64_t M, ggml_tensor * dst,
                 int ith, int nth, Slice scratch) {
    k.product(w->type, static_cast<const uint8_t *>(w->data), w->nb[1], w->ne[0], w->ne[1], packed, M,
              static_cast<float *>(dst->data), row_stride(dst), ith, nth, scratch);
}

// src: x, the graph's scratch
void op_pack(ggml_tensor * dst, int ith, int nth, void * ud) {
    const ProductKernel & k = of(ud);
    const ggml_tensor * x = dst->src[0];
    const int64_t K = x->ne[0], M = x->ne[1];
    k.pack(static_cast<const float *>(x->data), K, M, row_stride(x), static_cast<uint8_t *>(dst->data), ith, nth,
           thread_slice(dst->src[1], k.pack_scratch(K, M).bytes(), ith, nth));
}

// src: w, packed x, x, the graph's scratch
void op_product(ggml_tensor * dst, int ith, int nth, void * ud) {
    const ProductKernel & k = of(ud);
    const int64_t K = dst->src[0]->ne[0], M = dst->src[2]->ne[1];
    run_product(k, dst->src[0], static_cast<const uint8_t *>(dst->src[1]->data), M, dst, ith, nth,
                thread_slice(dst->src[3], k.product_scratch(K, M).bytes(), ith, nth));
}

// A thread's scratch in a direct node: its own packed rows, then the pack's and the product's.
SliceSize direct_scratch(const ProductKernel & k, int64_t K, int64_t M) {
    return SliceSize().add<uint8_t>(k.packed_bytes(K, M)).add(k.pack_scratch(K, M)).add(k.product_scratch(K, M));
}

// src: w, x, the graph's scratch. Fewer than min_batch activation rows (decode): every thread
// quantizes them itself, into its own scratch (a few hundred nanoseconds for a row), then takes
// its share of the weight rows: one node, where a pack node would add a step that one thread runs
// while the others wait at two barriers. The same bytes as the pack node writes, so the same bits.
void op_direct(ggml_tensor * dst, int ith, int nth, void * ud) {
    const ProductKernel & k = of(ud);
    const ggml_tensor * x = dst->src[1];
    const int64_t K = x->ne[0], M = x->ne[1];
    Slice s = thread_slice(dst->src[2], direct_scratch(k, K, M).bytes(), ith, nth);
    uint8_t * packed = s.take<uint8_t>(k.packed_bytes(K, M));
    k.pack(static_cast<const float *>(x->data), K, M, row_stride(x), packed, 0, 1, s);
    run_product(k, dst->src[0], packed, M, dst, ith, nth, s);
}

// Nodes are named after what they compute, the weight's name and type for a product ("product q5_0
// blk.3.ffn_down.weight"): graph dumps and `kvlab profile` show them.
ggml_tensor * pack_node(ggml_context * ctx, const ProductKernel & k, GraphScratch & scratch, ggml_tensor * x) {
    ggml_tensor * src[2] = {x, scratch.need(k.pack_scratch(x->ne[0], x->ne[1]).bytes())};
    return ggml_format_name(ggml_custom_4d(ctx, GGML_TYPE_I8, int64_t(k.packed_bytes(x->ne[0], x->ne[1])), 1, 1, 1, src,
                                           2, op_pack, GGML_N_TASKS_MAX, userdata(k)),
                            "pack %s", k.name);
}

ggml_tensor * named_product(ggml_tensor * node, const ggml_tensor * w) {
    return ggml_format_name(node, "product %s %s", ggml_type_name(w->type), w->name);
}

ggml_tensor * product_node(ggml_context * ctx, const ProductKernel & k, GraphScratch & scratch, ggml_tensor * w,
                           ggml_tensor * packed, ggml_tensor * x) {
    ggml_tensor * src[4] = {w, packed, x, scratch.need(k.product_scratch(w->ne[0], x->ne[1]).bytes())};
    return named_product(
        ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, src, 4, op_product, GGML_N_TASKS_MAX, userdata(k)),
        w);
}

ggml_tensor * direct_node(ggml_context * ctx, const ProductKernel & k, GraphScratch & scratch, ggml_tensor * w,
                          ggml_tensor * x) {
    ggml_tensor * src[3] = {w, x, scratch.need(direct_scratch(k, w->ne[0], x->ne[1]).bytes())};
    return named_product(
        ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[1], x->ne[1], 1, 1, src, 3, op_direct, GGML_N_TASKS_MAX, userdata(k)),
        w);
}

bool plain_operands(const ggml_tensor * w, const ggml_tensor * x) {
    return ggml_n_dims(w) == 2 && w->ne[0] % k_qk == 0 && w->buffer && ggml_backend_buffer_is_host(w->buffer) &&
           !w->extra && x->type == GGML_TYPE_F32 && x->ne[2] == 1 && x->ne[3] == 1 && x->ne[0] == w->ne[0] &&
           x->nb[0] == sizeof(float) && x->ne[1] >= 1;
}

}  // namespace

const ProductKernel * product_kernel(Products products, const ggml_tensor * w, const ggml_tensor * x,
                                     const PanelSet * panels) {
    if (panels && panels->count(w)) {
        if (!plain_operands(w, x)) return nullptr;
        return products == Products::amx ? &amx_kernel(true) : &vnni_kernel(true);
    }
    if (!plain_operands(w, x)) return nullptr;
    const ProductKernel * candidates[2] = {&q4_1_kernel(), &q8_0_kernel()};
    if (products == Products::amx) candidates[0] = candidates[1] = &amx_kernel();
    if (products == Products::vnni) candidates[0] = candidates[1] = &vnni_kernel();
    for (const ProductKernel * k : candidates)
        if (k->available() && k->supports(w->type)) return k;
    return nullptr;
}

namespace {

// x as the kernels take it where w is packed into panels (ggml's mul_mat cannot read w).
ggml_tensor * plain_for_panels(ggml_context * ctx, const ggml_tensor * w, ggml_tensor * x, const PanelSet * panels) {
    if (!panels || !panels->count(w) || plain_operands(w, x)) return x;
    if (x->type == GGML_TYPE_F32 && x->ne[0] == w->ne[0]) {
        ggml_tensor * c = ggml_cont_2d(ctx, x, x->ne[0], ggml_nelements(x) / x->ne[0]);
        if (plain_operands(w, c)) return c;
    }
    throw Error("internal", std::string("[products] ") + w->name + " is packed into panels and x is not an F32 matrix");
}

}  // namespace

namespace {

// src: w (panels), ids; tokens split over threads.
void op_panel_rows(ggml_tensor * dst, int ith, int nth, void *) {
    const ggml_tensor * ids = dst->src[1];
    const int64_t n = ids->ne[0], i0 = n * ith / nth, i1 = n * (ith + 1) / nth;
    panel_rows(dst->src[0], static_cast<const int32_t *>(ids->data) + i0, i1 - i0,
               static_cast<float *>(dst->data) + i0 * row_stride(dst), row_stride(dst));
}

}  // namespace

ggml_tensor * get_rows(ggml_context * ctx, ggml_tensor * w, ggml_tensor * ids, const PanelSet * panels) {
    if (!panels || !panels->count(w)) return ggml_get_rows(ctx, w, ids);
    if (ids->type != GGML_TYPE_I32 || ggml_n_dims(ids) != 1)
        throw Error("internal", std::string("[products] rows of ") + w->name + ": ids must be an I32 vector");
    ggml_tensor * src[2] = {w, ids};
    return ggml_format_name(ggml_custom_4d(ctx, GGML_TYPE_F32, w->ne[0], ids->ne[0], 1, 1, src, 2, op_panel_rows,
                                           GGML_N_TASKS_MAX, nullptr),
                            "rows %s", w->name);
}

ggml_tensor * mul_mat(ggml_context * ctx, Products products, GraphScratch & scratch, ggml_tensor * w, ggml_tensor * x,
                      const PanelSet * panels) {
    x = plain_for_panels(ctx, w, x, panels);
    const ProductKernel * k = product_kernel(products, w, x, panels);
    if (!k) return ggml_mul_mat(ctx, w, x);
    if (x->ne[1] < k->min_batch) return direct_node(ctx, *k, scratch, w, x);
    return product_node(ctx, *k, scratch, w, pack_node(ctx, *k, scratch, x), x);
}

void mul_mats(ggml_context * ctx, Products products, GraphScratch & scratch, ggml_tensor * const * w,
              ggml_tensor ** out, int n, ggml_tensor * x, const PanelSet * panels) {
    const ProductKernel * k = product_kernel(products, w[0], x, panels);
    // one pack serves every kernel of the block order (panels or not: the same activations)
    const auto same_pack = [&](const ProductKernel * a, const ProductKernel * b) {
        return a == b || (a && b && a->pack == b->pack && a->packed_bytes == b->packed_bytes &&
                          a->pack_scratch == b->pack_scratch);
    };
    const bool shared = k && x->ne[1] >= k->min_batch && std::all_of(w + 1, w + n, [&](const ggml_tensor * wi) {
                            return same_pack(product_kernel(products, wi, x, panels), k);
                        });
    if (!shared) {
        for (int i = 0; i < n; ++i) out[i] = mul_mat(ctx, products, scratch, w[i], x, panels);
        return;
    }
    ggml_tensor * packed = pack_node(ctx, *k, scratch, x);
    for (int i = 0; i < n; ++i)
        out[i] = product_node(ctx, *product_kernel(products, w[i], x, panels), scratch, w[i], packed, x);
}

}  // namespace kvlab::kernels
