// The choices of kvlab's kernels that callers pass down as options (ModelOptions::products):
// which arithmetic the quantized weight products run.
#pragma once

#include <string>

namespace kvlab {

// The arithmetic of the Q4_1, Q5_0 and Q8_0 weight products (docs/kernels.md):
//   ggml: kvlab's register-blocked kernels with ggml's own sequence of operations per output,
//         bit-identical to ggml's mul_mat and so to libllama's logits (AVX-512 VNNI; elsewhere
//         ggml_mul_mat itself runs);
//   amx:  kvlab's own block order (one exact integer sum per 32-value block), on Intel AMX tiles
//         from 16 activation rows and AVX-512 VNNI below: the same bits at every batch size,
//         a few float ulps from ggml's;
//   vnni: the same block order and the same bits on AVX-512 VNNI at every batch size (CPUs with
//         VNNI and BITALG but no AMX: AMD Zen 4 and 5, Intel from Ice Lake).
enum class Products { ggml, amx, vnni };

// Whether this CPU and kernel run the AMX tiles (compiled with AMX-INT8 and AVX-512 VNNI, the
// CPU has them and Linux granted the process the tile state, asked once).
bool amx_available();
// Whether this CPU runs the block order by AVX-512 VNNI (VNNI and BITALG, compiled in).
bool vnni_available();
// amx where amx_available(), else vnni where vnni_available(), else ggml: what "auto" means.
Products default_products();
// "auto", "ggml", "amx" or "vnni"; throws kvlab::Error for another name and for "amx" or "vnni"
// where unavailable.
Products parse_products(const std::string & name);
const char * products_name(Products p);

}  // namespace kvlab
