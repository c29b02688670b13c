#include "llama_ref.h"

#include <algorithm>
#include <cstring>

#include "kvlab/error.h"
#include "kvlab/sys.h"
#include "llama.h"

namespace kvlab {

LlamaRef::LlamaRef(const std::string & path, int n_threads, int n_ctx, int n_ubatch, bool repack, CacheTypes types) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = repack;  // false: no repacked weight layouts (as kvlab with KVLAB_REPACK=0)
    model_.reset(llama_model_load_from_file(path.c_str(), mp));
    if (!model_) throw Error("llama.cpp", "could not load " + path);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = uint32_t(n_ctx);
    cp.n_batch = uint32_t(n_ctx);
    cp.n_ubatch = uint32_t(n_ubatch);
    cp.n_seq_max = 1;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;  // kvlab uses ggml's flash attention too
    cp.type_k = types.k;
    cp.type_v = types.v;
    cp.no_perf = true;
    ctx_.reset(llama_init_from_model(model_.get(), cp));
    if (!ctx_) throw Error("llama.cpp", "could not create a context for " + path);
}

int32_t LlamaRef::n_vocab() const {
    return llama_vocab_n_tokens(llama_model_get_vocab(model_.get()));
}

void LlamaRef::reset() {
    llama_memory_clear(llama_get_memory(ctx_.get()), true);
    n_past_ = 0;
}

namespace {

// A llama_batch freed when it goes out of scope.
struct Batch {
    llama_batch b;
    explicit Batch(int32_t n) : b(llama_batch_init(n, 0, 1)) {}
    ~Batch() { llama_batch_free(b); }
    Batch(const Batch &) = delete;
    Batch & operator=(const Batch &) = delete;
};

}  // namespace

std::vector<float> LlamaRef::decode(const std::vector<int32_t> & tokens, bool all) {
    const int32_t n = int32_t(tokens.size());
    Batch batch(n);
    llama_batch & b = batch.b;
    for (int32_t i = 0; i < n; ++i) {
        b.token[i] = tokens[i];
        b.pos[i] = n_past_ + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all || i == n - 1;
    }
    b.n_tokens = n;
    const int32_t rc = llama_decode(ctx_.get(), b);
    if (rc != 0) throw Error("llama.cpp", "llama_decode failed with code " + std::to_string(rc));
    llama_synchronize(ctx_.get());
    n_past_ += n;
    const int32_t nv = n_vocab();
    std::vector<float> out;
    if (all) {
        out.resize(size_t(n) * nv);
        for (int32_t i = 0; i < n; ++i)
            std::memcpy(out.data() + size_t(i) * nv, llama_get_logits_ith(ctx_.get(), i), nv * 4);
    } else {
        const float * l = llama_get_logits_ith(ctx_.get(), -1);
        out.assign(l, l + nv);
    }
    return out;
}

std::vector<int32_t> LlamaRef::greedy(const std::vector<int32_t> & prompt, int n) {
    reset();
    std::vector<float> logits = decode(prompt, false);
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
        const int32_t t = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(t);
        if (i + 1 < n) logits = decode({t}, false);
    }
    return out;
}

double LlamaRef::time_prefill(const std::vector<int32_t> & tokens) {
    reset();
    const double t0 = now_seconds();
    decode(tokens, false);
    return now_seconds() - t0;
}

double LlamaRef::time_decode(int32_t first_token, int n) {
    int32_t t = first_token;
    const double t0 = now_seconds();
    for (int i = 0; i < n; ++i) {
        std::vector<float> l = decode({t}, false);
        t = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    }
    return now_seconds() - t0;
}

}  // namespace kvlab
