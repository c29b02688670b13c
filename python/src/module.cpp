// The module `kvlab._kvlab`: kvlab errors as kvlab.Error (a RuntimeError carrying kvlab's
// message), the process's memory figures, and the binding files' parts.
#include <cstdlib>

#include "bindings.h"
#include "kvlab/error.h"
#include "kvlab/log.h"
#include "kvlab/provenance.h"
#include "kvlab/sys.h"

namespace kvlab::py {

const app::Environment & environment() {
    static const app::Environment e = app::environment_from([](const char * name) {
        const char * v = std::getenv(name);
        return std::string(v ? v : "");
    });
    return e;
}

pb::object json_to_python(const nlohmann::json & j) {
    return pb::module_::import("json").attr("loads")(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

nlohmann::json json_from_python(const pb::object & o) {
    return nlohmann::json::parse(pb::module_::import("json").attr("dumps")(o).cast<std::string>());
}

pb::array_t<float> to_numpy(std::vector<float> && v, std::vector<pb::ssize_t> shape) {
    auto * owned = new std::vector<float>(std::move(v));
    pb::capsule free_it(owned, [](void * p) { delete static_cast<std::vector<float> *>(p); });
    return pb::array_t<float>(shape, owned->data(), free_it);
}

std::vector<int32_t> token_ids(const PyModel & m, const std::vector<int64_t> & ids, const char * what) {
    const int64_t n_vocab = m.model().hparams().n_vocab;
    std::vector<int32_t> out;
    out.reserve(ids.size());
    for (int64_t id : ids) {
        if (id < 0 || id >= n_vocab)
            throw Error("python", std::string(what) + ": token id " + std::to_string(id) +
                                      " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        out.push_back(int32_t(id));
    }
    return out;
}

}  // namespace kvlab::py

PYBIND11_MODULE(_kvlab, m) {
    namespace py = kvlab::py;
    m.doc() = "kvlab: KV-cache reuse and compression on llama.cpp's ggml (see help(kvlab))";
    pybind11::register_exception<kvlab::Error>(m, "Error", PyExc_RuntimeError);
    // ggml's and libllama's messages: errors only unless KVLAB_VERBOSE=1, as the CLI
    kvlab::set_backend_logging(py::environment().verbose);
    m.attr("__version__") = kvlab::kvlab_version();
    m.def(
        "memory_snapshot",
        [] {
            const kvlab::MemInfo mi = kvlab::mem_info();
            return pybind11::dict(pybind11::arg("process_rss_bytes") = mi.rss_bytes,
                                  pybind11::arg("process_peak_rss_bytes") = mi.peak_rss_bytes);
        },
        "The process's resident memory and its peak (bytes); Model.memory_snapshot() adds the model's buffers.");
    m.def("reset_peak", &kvlab::reset_peak_rss, "Resets the process's peak resident memory to the current one.");
    py::bind_model(m);
    py::bind_cache(m);
    py::bind_compress(m);
    py::bind_eval(m);
}
