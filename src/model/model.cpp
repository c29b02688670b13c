#include "kvlab/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"
#include "kernels/products.h"
#include "kvlab/cpu_share.h"
#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "model/arch.h"
#include "model/gguf_meta.h"
#include "model/weight_buffers.h"

namespace kvlab {

namespace {

// The hyper-parameters every architecture has (HParams); the architecture reads its own.
HParams read_common_hparams(const ModelReader & r, const std::string & arch) {
    HParams hp;
    hp.arch = arch;
    // The ranges are generous bounds on real models; they keep a crafted file's values from
    // overflowing sizes before the tensor shapes are checked against them.
    constexpr int32_t k_max_dim = 1 << 20;
    hp.n_layer = r.required_int(r.key("block_count"), 1, 4096);
    hp.n_embd = r.required_int(r.key("embedding_length"), 1, k_max_dim);
    hp.n_head = r.required_int(r.key("attention.head_count"), 1, 4096);
    hp.n_head_kv = r.get_int(r.key("attention.head_count_kv"), hp.n_head, 1, hp.n_head);
    hp.head_dim = r.get_int(r.key("attention.key_length"), std::max(1, hp.n_embd / hp.n_head), 1, 4096);
    const int32_t v_dim = r.get_int(r.key("attention.value_length"), hp.head_dim, 1, 4096);
    hp.n_ctx_train = r.required_int(r.key("context_length"), 1, 1 << 24);
    hp.n_rot = r.get_int(r.key("rope.dimension_count"), hp.head_dim, 1, 4096);
    hp.rope_theta = r.get_float(r.key("rope.freq_base"), 10000.0f, 1e-3f, 1e12f);
    const std::string scaling = r.get_string(r.key("rope.scaling.type"));
    const float factor = r.get_float(r.key("rope.scaling.factor"), 0.0f, 0.0f, 1e6f);
    if (!scaling.empty()) hp.rope_scaling_type = scaling;
    if (scaling == "linear" && factor > 0.0f) hp.rope_freq_scale = 1.0f / factor;
    if (scaling == "yarn" || scaling == "longrope") r.fail("RoPE scaling '" + scaling + "' is not supported yet");

    if (hp.n_head % hp.n_head_kv != 0)
        r.fail("attention.head_count " + std::to_string(hp.n_head) + " is not a multiple of head_count_kv " +
               std::to_string(hp.n_head_kv));
    if (hp.head_dim % 2 != 0)
        r.fail("attention.key_length " + std::to_string(hp.head_dim) + " is odd (RoPE rotates pairs)");
    if (v_dim != hp.head_dim) r.fail("key and value head sizes differ (unsupported)");
    if (hp.n_rot != hp.head_dim) r.fail("partial RoPE is not supported");
    return hp;
}

struct FileCloser {
    void operator()(std::FILE * f) const { std::fclose(f); }
};

// Reads every tensor's data from the file at path into the weight buffer.
void read_tensor_data(const std::string & path, const gguf_context * gguf, ggml_context * ctx) {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
    if (!f) throw Error("model", "cannot open " + path);
    const size_t data_offset = gguf_get_data_offset(gguf);
    std::vector<uint8_t> staging;
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf); ++i) {
        ggml_tensor * tensor = ggml_get_tensor(ctx, gguf_get_tensor_name(gguf, i));
        const size_t n = ggml_nbytes(tensor);
        const size_t off = data_offset + gguf_get_tensor_offset(gguf, i);
        void * dst = tensor->data;
        if (!ggml_backend_buffer_is_host(tensor->buffer)) {  // e.g. repacked: set_tensor converts
            staging.resize(n);
            dst = staging.data();
        }
        if (fseeko(f.get(), off_t(off), SEEK_SET) != 0 || std::fread(dst, 1, n, f.get()) != n)
            throw Error("gguf", path + ": could not read tensor '" + std::string(tensor->name) + "' (truncated?)");
        if (dst != tensor->data) ggml_backend_tensor_set(tensor, dst, 0, n);
    }
}

// The layers' projections and the output head: only ever the weight of a product (graph::matmul),
// so they may take another layout (ggml's repacked buffers, kvlab's panels); criticalkv reads W_o
// from the file (Model::file_data). token_embd is gathered by rows (and is the head too where the
// file ties them: it then keeps its layout).
bool product_only(const ggml_tensor * t) {
    const std::string n = t->name;
    if (n == "output.weight") return true;
    for (const char * s : {".attn_q.weight", ".attn_k.weight", ".attn_v.weight", ".attn_output.weight",
                           ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"})
        if (n.rfind("blk.", 0) == 0 && n.size() > std::strlen(s) &&
            n.compare(n.size() - std::strlen(s), std::string::npos, s) == 0)
            return true;
    return false;
}

// token_embd where it is the head too (no output.weight) and Q8_0: the head streams it on every
// token, and kernels::get_rows reads its rows from the panels as ggml_get_rows does.
bool tied_q8_0_head(ggml_context * ctx, const ggml_tensor * t) {
    return std::strcmp(t->name, "token_embd.weight") == 0 && t->type == GGML_TYPE_Q8_0 &&
           !ggml_get_tensor(ctx, "output.weight");
}

}  // namespace

float HParams::kq_scale() const {
    return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(float(head_dim));
}

// The backend's thread count: fixed, or following the idle CPUs (refresh_threads).
struct Model::Threads {
    std::mutex mu;
    std::atomic<int> n{1};
    std::unique_ptr<IdleCpuTracker> tracker;  // null: fixed
};

struct Model::Sha {
    std::once_flag once;
    std::string hex;
};

Model::Model() : sha_(std::make_unique<Sha>()), threads_(std::make_unique<Threads>()) {}

const std::string & Model::file_sha256() const {
    std::call_once(sha_->once, [this] { sha_->hex = sha256_file_cached(path_, hash_cache_dir_); });
    return sha_->hex;
}
Model::~Model() = default;
Model::Model(Model &&) noexcept = default;
Model & Model::operator=(Model &&) noexcept = default;

std::unique_ptr<Model> Model::load(const std::string & path, const ModelOptions & opts) {
    const double t0 = now_seconds();
    std::unique_ptr<Model> m(new Model());
    m->path_ = path;
    m->products_ = opts.products;
    m->hash_cache_dir_ = opts.hash_cache_dir;
    const int n_threads = opts.n_threads;
    if (n_threads < 0) throw Error("model", "threads cannot be negative");
    if (n_threads == 0) {
        m->threads_->tracker = std::make_unique<IdleCpuTracker>(idle_cpus());
        m->threads_->n = m->threads_->tracker->current();
    } else {
        m->threads_->n = n_threads;
    }

    m->gguf_ = open_gguf_checked(path, /*no_alloc=*/true, &m->ctx_);
    const gguf_context * gguf = m->gguf_.get();
    const std::string arch = gguf_string(gguf, "general.architecture");
    if (arch.empty()) throw Error("model", path + ": no general.architecture in the GGUF metadata");
    const ArchEntry * entry = find_architecture(arch);
    if (!entry) {
        std::string known;
        for (const auto & n : architecture_names()) known += (known.empty() ? "" : ", ") + n;
        throw Error("model", path + ": unsupported architecture '" + arch + "' (kvlab supports: " + known + ")");
    }
    const ModelReader reader(gguf, m->ctx_.get(), path, arch);
    m->hparams_ = read_common_hparams(reader, arch);
    m->arch_ = entry->make();
    m->arch_->load(reader, m->hparams_);

    m->backend_.reset(ggml_backend_cpu_init());
    if (!m->backend_) throw Error("backend", "could not initialise the ggml CPU backend");
    ggml_backend_cpu_set_n_threads(m->backend_.get(), m->threads_->n);
    // under the block order, the weights it reads from panels (Q4_K too) are not given to ggml's repacking
    const bool block_order = opts.products == Products::amx || opts.products == Products::vnni;
    const auto may_repack = [block_order](const ggml_tensor * t) {
        return product_only(t) && !(block_order && kernels::panels_available(t));
    };
    WeightBuffers wb = allocate_weights(m->ctx_.get(), m->backend_.get(), opts.repack, may_repack);
    m->repacked_ = std::move(wb.repacked);
    m->buffer_ = std::move(wb.plain);
    m->n_repacked_ = wb.n_repacked;
    read_tensor_data(path, gguf, m->ctx_.get());
    if (opts.repack && (opts.products == Products::amx || opts.products == Products::vnni))
        for (ggml_tensor * t = ggml_get_first_tensor(m->ctx_.get()); t; t = ggml_get_next_tensor(m->ctx_.get(), t))
            if ((product_only(t) || tied_q8_0_head(m->ctx_.get(), t)) && t->buffer == m->buffer_.get() &&
                kernels::panels_available(t)) {
                kernels::pack_panels(t);
                m->panels_.insert(t);
            }
    m->load_seconds_ = now_seconds() - t0;
    return m;
}

std::vector<uint8_t> Model::file_data(const ggml_tensor * t) const {
    const int64_t i = gguf_find_tensor(gguf_.get(), t->name);
    if (i < 0) throw Error("model", path_ + ": no tensor '" + std::string(t->name) + "' in the file");
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path_.c_str(), "rb"));
    if (!f) throw Error("model", "cannot open " + path_);
    std::vector<uint8_t> out(ggml_nbytes(t));
    const size_t off = gguf_get_data_offset(gguf_.get()) + gguf_get_tensor_offset(gguf_.get(), i);
    if (fseeko(f.get(), off_t(off), SEEK_SET) != 0 || std::fread(out.data(), 1, out.size(), f.get()) != out.size())
        throw Error("model", path_ + ": could not read tensor '" + std::string(t->name) + "' (truncated?)");
    return out;
}

const ggml_tensor * Model::attn_output(int il) const {
    return arch_->attn_output(il);
}

const ggml_tensor * Model::rope_freq_factors() const {
    return arch_->rope_freq_factors();
}

int Model::n_threads() const {
    return threads_->n;
}

void Model::set_n_threads(int n_threads) {
    std::lock_guard<std::mutex> lock(threads_->mu);
    threads_->tracker.reset();
    threads_->n = std::max(1, n_threads);
    ggml_backend_cpu_set_n_threads(backend_.get(), threads_->n);
}

bool Model::auto_threads() const {
    std::lock_guard<std::mutex> lock(threads_->mu);
    return threads_->tracker != nullptr;
}

int Model::refresh_threads() const {
    std::lock_guard<std::mutex> lock(threads_->mu);
    if (!threads_->tracker) return threads_->n;
    const int n = threads_->tracker->threads();
    if (n != threads_->n) {
        threads_->n = n;
        ggml_backend_cpu_set_n_threads(backend_.get(), n);
    }
    return n;
}

uint64_t Model::weight_bytes() const {
    return (repacked_ ? ggml_backend_buffer_get_size(repacked_.get()) : 0) +
           ggml_backend_buffer_get_size(buffer_.get());
}

std::string Model::backend_name() const {
    return ggml_backend_name(backend_.get());
}

}  // namespace kvlab
