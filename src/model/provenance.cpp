#include "kvlab/provenance.h"

#include <filesystem>

#include "ggml.h"
#include "kvlab/model.h"
#include "kvlab/sys.h"
#include "kvlab/text.h"
#include "model/arch.h"
#include "model/gguf_meta.h"

// k_git_commit, written at build time (cmake/git_commit.cmake)
#include "git_commit.inc"

namespace kvlab {

std::string kvlab_version() {
    return KVLAB_VERSION;
}
std::string kvlab_git_commit() {
    return k_git_commit;
}

nlohmann::json hparams_json(const Model & model) {
    const HParams & hp = model.hparams();
    nlohmann::json j = {
        {"arch", hp.arch},
        {"n_layer", hp.n_layer},
        {"n_head", hp.n_head},
        {"n_head_kv", hp.n_head_kv},
        {"head_dim", hp.head_dim},
        {"n_embd", hp.n_embd},
        {"n_vocab", hp.n_vocab},
        {"n_ctx_train", hp.n_ctx_train},
        {"rope",
         {{"mode", hp.rope_mode == GGML_ROPE_TYPE_NEOX ? "neox" : "normal"},
          {"theta", hp.rope_theta},
          {"scaling", hp.rope_scaling_type},
          {"freq_scale", hp.rope_freq_scale},
          {"freq_factors", model.rope_freq_factors() != nullptr}}},
    };
    if (hp.has_sliding_layers()) {  // only then: the other models' hashes stay what they were
        std::vector<int> sliding;
        for (int il = 0; il < hp.n_layer; ++il)
            if (hp.window(il) > 0) sliding.push_back(il);
        j["sliding_window"] = {{"n_swa", hp.n_swa}, {"layers", sliding}, {"rope_theta", hp.rope_theta_swa}};
        j["attn_scale"] = hp.kq_scale();
    }
    model.arch().describe(j);  // n_ff, rms_eps, ...: what the architecture has
    return j;
}

std::string hparams_hash(const Model & model) {
    const std::string canonical = hparams_json(model).dump();  // keys sorted: a canonical form
    return sha256_hex(canonical.data(), canonical.size());
}

nlohmann::json provenance(const Model & model, const Tokenizer & tok) {
    namespace fs = std::filesystem;
    const GgufSummary gs = summarize_gguf(model.gguf());
    nlohmann::json j;
    j["model"] = {
        {"path", fs::absolute(model.path()).string()},
        {"file_bytes", fs::file_size(model.path())},
        {"sha256", model.file_sha256()},
        {"gguf", to_json(gs)},
    };
    j["hparams"] = hparams_json(model);
    j["tokens"] = {{"bos", tok.bos()},
                   {"eos", tok.eos()},
                   {"eot", tok.eot()},
                   {"adds_bos", tok.adds_bos()},
                   {"eog", tok.eog_ids()}};
    j["build"] = {
        {"kvlab_version", kvlab_version()},
        {"kvlab_git_commit", kvlab_git_commit()},
        {"ggml_version", ggml_version()},
        {"ggml_commit", ggml_commit()},
        {"llama_cpp_python_sdist", KVLAB_LLAMA_CPP_PY_VERSION},
    };
    j["machine"] = {
        {"backend", model.backend_name()},
        {"cpu", cpu_model()},
        {"n_cpus", n_cpus()},
        {"threads", model.n_threads()},
        {"threads_follow_load", model.auto_threads()},     // -t 0: re-chosen each second from the idle CPUs
        {"repacked_weight_matrices", model.n_repacked()},  // in ggml's repacked CPU layouts
        {"panel_weight_matrices", model.panels().size()},  // in kvlab's 16-row panels
        {"products", products_name(model.products())},     // the quantized products' arithmetic: ggml, amx or vnni
        {"os", os_release()},
        {"host", hostname()},
    };
    return j;
}

}  // namespace kvlab
