// kvlab.Model: the seed's MLXModel on kvlab's engine (S1-S10 of ../shared/seed/README.md):
// loading with provenance (`info`), the chat template, tokenization, prefill, next-token
// logits, generation from a cache and from scratch, memory figures.
#include <filesystem>

#include "app/options.h"
#include "bindings.h"
#include "kvlab/error.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::py {

namespace {

// The seed's ModelInfo fields, filled from the GGUF (and kvlab's full provenance record).
pb::dict model_info(const PyModel & pm, const std::string & asked) {
    const Model & m = pm.model();
    const HParams & hp = m.hparams();
    const nlohmann::json prov = provenance(m, pm.tok());
    const nlohmann::json & gguf = prov["model"]["gguf"];
    std::string dominant;
    uint64_t most = 0;
    for (const auto & [type, bytes] : gguf["tensor_type_bytes"].items())
        if (bytes.get<uint64_t>() > most) most = bytes.get<uint64_t>(), dominant = type;
    pb::dict d;
    d["repo_id"] = asked;
    d["snapshot_path"] = pm.loaded.path;
    d["revision"] = prov["model"]["sha256"].get<std::string>().substr(0, 12);
    d["model_type"] = hp.arch;
    d["num_layers"] = hp.n_layer;
    d["num_kv_heads"] = hp.n_head_kv;
    d["num_attention_heads"] = hp.n_head;
    d["head_dim"] = hp.head_dim;
    d["hidden_size"] = hp.n_embd;
    d["vocab_size"] = hp.n_vocab;
    d["max_position_embeddings"] = hp.n_ctx_train;
    d["rope_theta"] = hp.rope_theta;
    d["rope_scaling"] = hp.rope_scaling_type == "none"
                            ? pb::object(pb::none())
                            : pb::object(pb::dict(pb::arg("type") = hp.rope_scaling_type,
                                                  pb::arg("factor") = 1.0 / double(hp.rope_freq_scale)));
    d["sliding_window"] = hp.n_swa > 0 ? pb::object(pb::int_(hp.n_swa)) : pb::object(pb::none());
    d["weight_dtype"] = dominant;
    d["weight_quantization"] = json_to_python(gguf["tensor_type_counts"]);
    d["tokenizer_hash"] = gguf["tokenizer_sha256"].get<std::string>();
    d["chat_template_hash"] = gguf["chat_template_sha256"].is_string()  // None: no chat template (a base model)
                                  ? pb::object(pb::str(gguf["chat_template_sha256"].get<std::string>()))
                                  : pb::object(pb::none());
    d["config_hash"] = hparams_hash(m);
    d["weight_files_sha256"] = pb::dict(pb::arg(std::filesystem::path(pm.loaded.path).filename().c_str()) =
                                            prov["model"]["sha256"].get<std::string>());
    d["kvlab_version"] = kvlab_version();
    d["ggml_version"] = prov["build"]["ggml_version"].get<std::string>();
    d["bos_token_id"] = pm.tok().bos();
    d["eos_token_ids"] = pm.tok().eog_ids();
    d["provenance"] = json_to_python(prov);
    return d;
}

std::vector<ChatMessage> chat_messages(const std::vector<std::map<std::string, std::string>> & messages) {
    std::vector<ChatMessage> out;
    for (const auto & msg : messages) {
        const auto role = msg.find("role"), content = msg.find("content");
        if (role == msg.end() || content == msg.end())
            throw Error("python", "a chat message is a dict with 'role' and 'content'");
        out.push_back({role->second, content->second});
    }
    return out;
}

}  // namespace

void bind_model(pb::module_ & m) {
    pb::class_<PyModel, std::shared_ptr<PyModel>>(m, "Model", R"doc(A GGUF model on kvlab's engine.

Model(name_or_path, threads=0, products="auto", chunk=512, cache_type_k="f16", cache_type_v="f16")
loads a short name (`kvlab models`; fetched when missing) or a .gguf path. threads=0 follows the
CPUs other work leaves idle, as the CLI's -t 0. Calls on one model run one at a time.)doc")
        .def(pb::init([](const std::string & name, int threads, const std::string & products, int chunk,
                         const std::string & ctk, const std::string & ctv) {
                 auto pm = std::make_shared<PyModel>();
                 app::KernelArgs k;
                 k.products = products;
                 app::EngineArgs e;
                 e.chunk = chunk;
                 e.cache_type_k = ctk;
                 e.cache_type_v = ctv;
                 const EngineOptions eo = e.options();  // checks the names before the load
                 const ModelOptions mo = k.options(threads, environment().cache_dir);
                 {
                     pb::gil_scoped_release nogil;
                     const double t0 = now_seconds();
                     pm->loaded = app::load(name, mo, environment().models);
                     pm->load_ms = (now_seconds() - t0) * 1e3;
                     pm->engine = std::make_unique<Engine>(*pm->loaded.model, eo);
                 }
                 return pm;
             }),
             pb::arg("name_or_path"), pb::arg("threads") = 0, pb::arg("products") = "auto", pb::arg("chunk") = 512,
             pb::arg("cache_type_k") = "f16", pb::arg("cache_type_v") = "f16")
        .def_property_readonly("load_ms", [](const PyModel & pm) { return pm.load_ms; })
        .def_property_readonly("path", [](const PyModel & pm) { return pm.loaded.path; })
        .def_property_readonly("threads", [](const PyModel & pm) { return pm.model().n_threads(); })
        .def_property_readonly(
            "info",
            [](const PyModel & pm) { return model_info(pm, std::filesystem::path(pm.loaded.path).stem().string()); },
            "The seed's ModelInfo fields from the GGUF (architecture, shapes, RoPE, hashes, BOS/EOS ids, "
            "versions), and kvlab's whole provenance record under 'provenance'.")
        .def(
            "chat_prompt_tokens",
            [](const PyModel & pm, const std::vector<std::map<std::string, std::string>> & messages,
               bool add_generation_prompt) { return pm.tok().chat(chat_messages(messages), add_generation_prompt); },
            pb::arg("messages"), pb::arg("add_generation_prompt") = true,
            "The model's own chat template applied to [{'role', 'content'}, ...], as token ids (no double BOS).")
        .def(
            "encode",
            [](const PyModel & pm, const std::string & text, bool add_special_tokens) {
                return pm.tok().encode(text, add_special_tokens, false);
            },
            pb::arg("text"), pb::arg("add_special_tokens") = false)
        .def(
            "decode",
            [](const PyModel & pm, const std::vector<int64_t> & ids) {
                return pm.tok().decode(token_ids(pm, ids, "decode"));
            },
            pb::arg("ids"))
        .def(
            "memory_snapshot",
            [](const PyModel & pm) {
                const MemInfo mi = mem_info();
                return pb::dict(pb::arg("weights_bytes") = pm.model().weight_bytes(),
                                pb::arg("compute_bytes") = pm.engine->compute_bytes(),
                                pb::arg("process_rss_bytes") = mi.rss_bytes,
                                pb::arg("process_peak_rss_bytes") = mi.peak_rss_bytes);
            },
            "kvlab's figures under its own names: the weights' and compute buffer's bytes, the process's RSS "
            "and peak RSS (each cache's bytes: Cache.nbytes).");
}

}  // namespace kvlab::py
