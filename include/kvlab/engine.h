// The engine: chunked prefill into a KvStore, float32 next-token logits, sampling and
// generation from a cache, with synchronized timings (docs/design.md, measurement rules).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ggml-cpp.h"
#include "kvlab/cache.h"
#include "kvlab/model.h"
#include "kvlab/observer.h"

namespace kvlab {

class OpProfile;    // kvlab/op_profile.h
struct GraphFrame;  // src/engine/graph_frame.h
namespace kernels {
class GraphScratch;  // src/kernels/scratch.h
}

// Which attention kernel the graphs run.
//  kvlab: kvlab's float32 kernel on every cache shape (the default). Its result for a
//         query row never depends on the chunk size, the batch or the thread count, so a
//         full cache and a compressed one are always compared under the same arithmetic.
//  ggml:  ggml's flash attention wherever a layer's heads hold the same positions (the
//         kernel libllama runs: logits bit-identical to libllama's for the same ubatch);
//         kvlab's kernel on the other layers. Below 64 query rows ggml rounds Q and the
//         V sums to F16.
enum class AttentionKernel { kvlab, ggml };
const char * attention_kernel_name(AttentionKernel k);
AttentionKernel parse_attention_kernel(const std::string & name);  // throws on an unknown name

struct EngineOptions {
    int32_t chunk_size = 512;  // tokens per prefill graph
    AttentionKernel attention = AttentionKernel::kvlab;
    // 0: compute on the model's backend with its threads. N > 0: on the engine's own CPU
    // backend with N threads, so that several engines on one model (its weights shared)
    // compute at the same time, each from its own thread.
    int32_t n_threads = 0;
    // The row types of the caches new_cache() makes (-ctk / -ctv). The engine attends over
    // a cache of any types, whoever made it.
    CacheTypes cache_types;
    // Times kvlab's own graph nodes on each thread (`kvlab profile`); not owned, nullptr: none.
    OpProfile * profile = nullptr;
    // Debugging: called with each graph once it is built, before it is allocated and computed.
    // Its tensors go by llama.cpp's names ("attn_norm-3", "l_out-3"; docs/kernels.md), found with
    // ggml_graph_get_tensor. Empty: none.
    std::function<void(ggml_cgraph *)> on_graph = nullptr;
};

struct SamplingParams {
    float temp = 0.0f;   // 0: greedy
    int32_t top_k = 0;   // 0: off
    float top_p = 1.0f;  // 1: off
    uint64_t seed = 0;
};

// Samples one token from raw logits [n_vocab]: the argmax (lowest id on ties) when
// greedy, else temperature, top-k and top-p over the logits, drawn from rng.
int32_t sample_token(const std::vector<float> & logits, const SamplingParams & p, std::mt19937_64 & rng);
// log(sum(exp(logits))) in double precision, rounded to float: what log_softmax subtracts.
float log_sum_exp(const std::vector<float> & logits);
// log-softmax of the logits, in place.
void log_softmax(std::vector<float> & logits);

// Compression while decoding (docs/methods.md "Compression during decoding"): generate() hands
// each decoded token's evaluation to `observer` and calls after_token(cache) once the token's
// rows are in the cache; after_token may compact the cache (KvStore::compact: positions stay
// original). `growth` >= 0: the most rows a segment gains between two compactions, reserved
// instead of max_tokens (the cache's memory stays bounded).
struct DecodeHook {
    const QueryObserver * observer = nullptr;
    std::function<void(KvStore &)> after_token;
    int64_t growth = -1;
};

struct GenerateOptions {
    int32_t max_tokens = 128;
    bool stop_on_eog = true;
    std::vector<int32_t> eog_ids;  // end-of-generation tokens (EOS, EOT, ...)
    SamplingParams sampling;
    int32_t n_logprobs = 0;               // top-K log-probabilities recorded at each generated position
    const DecodeHook * decode = nullptr;  // compression while decoding (not owned)
    // Teacher forcing: these tokens are emitted in turn instead of sampled (EOG does not stop,
    // at most their number), through the same steps and hook as a generation; the logits that
    // predict each (row t predicts forced[t], [n][n_vocab]) are appended to step_logits when set.
    const std::vector<int32_t> * forced = nullptr;
    std::vector<float> * step_logits = nullptr;
};

struct TokenLogprob {
    int32_t token = 0;
    float logprob = 0.0f;
    std::vector<std::pair<int32_t, float>> top;  // (token, logprob), best first
};

// The log-probability of tok and the k best ones (best first) from raw logits; ids: scratch.
TokenLogprob token_logprobs(const std::vector<float> & logits, int32_t tok, int32_t k, std::vector<int32_t> & ids);

struct PrefillStats {
    int64_t n_tokens = 0;
    int64_t n_chunks = 0;
    double seconds = 0.0;
    double tokens_per_second() const { return seconds > 0 ? double(n_tokens) / seconds : 0.0; }
};

struct GenerateResult {
    std::vector<int32_t> tokens;  // generated tokens (the EOG token that stopped it excluded)
    std::vector<TokenLogprob> logprobs;
    std::string stop_reason;  // "eog" | "max_tokens" | "caller"
    int64_t n_query = 0;
    double query_prefill_s = 0.0;  // query tokens through the model
    double ttft_s = 0.0;           // query submission -> first sampled token (query prefill included)
    double decode_s = 0.0;         // the remaining tokens
    int64_t n_decoded = 0;         // single-token evaluations in decode_s (one per token after the first)
    uint64_t kv_peak_bytes = 0;    // the most bytes the cache held allocated, from the query on
    double decode_tokens_per_second() const { return decode_s > 0 ? double(n_decoded) / decode_s : 0.0; }
};

class Engine {
public:
    // Throws kvlab::Error for options out of range and for models whose attention shape
    // kvlab's kernel cannot run (more than attn::k_max_group = 16 query heads per KV head).
    Engine(const Model & model, EngineOptions opts = {});

    const Model & model() const { return model_; }
    const EngineOptions & options() const { return opts_; }

    // An empty cache with room for `capacity` rows per (layer, head), of options().cache_types
    // or of `types`.
    KvStore new_cache(int64_t capacity) const;
    KvStore new_cache(int64_t capacity, CacheTypes types) const;

    // Appends tokens to the cache in chunks and returns the float32 logits of the last
    // token [n_vocab]. With all_logits, the logits of every token are stored there
    // (row-major [n_tokens][n_vocab]). Throws when the context would exceed the model's.
    // All or nothing: when anything throws (an observer included), the cache keeps the
    // rows and next_pos it had before the call; on a model with sliding-window layers, if
    // rows were freed meanwhile that a query at the old next_pos sees, the cache says so
    // (KvStore::lost_rows) and the engine refuses it from then on.
    std::vector<float> prefill(KvStore & cache, const std::vector<int32_t> & tokens, PrefillStats * stats = nullptr,
                               std::vector<float> * all_logits = nullptr, const QueryObserver * observer = nullptr);

    // Feeds the query on top of the cache, then samples up to max_tokens tokens.
    // on_token is called for each generated token as soon as it is sampled; when it
    // returns false generation stops there (stop_reason "caller": a stop string, a client
    // that went away).
    GenerateResult generate(KvStore & cache, const std::vector<int32_t> & query, const GenerateOptions & opts,
                            const std::function<bool(int32_t)> & on_token = {});

    // One sequence of a batched evaluation: n tokens appended to its own cache; the logits of its
    // last token go to logits ([n_vocab], null: not wanted).
    struct BatchItem {
        KvStore * cache = nullptr;
        const int32_t * tokens = nullptr;
        int64_t n = 0;
        float * logits = nullptr;
    };
    // Evaluates several sequences in one graph (continuous batching): the weight products run
    // over every sequence's rows at once (the weights read once per step), each sequence attends
    // over its own cache (kvlab's kernel; the caches of one row-type set, CacheTypes, but of any
    // lengths and compressions). A sequence's logits are those it gets alone, to the bit, where the
    // products give the same bits at every batch size (--products amx or vnni; ggml's may change
    // kernel with the batch). Each cache is all or nothing as in prefill. Throws for mixed row
    // types, a cache twice, a token outside the vocabulary or a sequence past the model's context.
    void eval_batch(const std::vector<BatchItem> & items);

    // Bytes of the compute buffer (graph intermediates) and of the kernels' scratch currently allocated.
    uint64_t compute_bytes() const;

private:
    // Runs one graph over n tokens appended to the cache; logits of `n_out` last rows.
    // Frees its graph context and undoes its commit on any exception.
    void eval(KvStore & cache, const int32_t * tokens, int64_t n, int64_t n_out, float * logits_out,
              const QueryObserver * observer = nullptr, int64_t tok0 = 0);
    // Huge pages for the compute buffer when ggml's allocator has made a new one.
    void advise_compute_buffer(ggml_backend_buffer_t buf);
    // The threads the next graph computes on (its scratch is sized for them).
    int graph_threads() const;
    // Places the graph's kernel scratch in scratch_buf_ (grown when it needs more).
    void bind_scratch(const kernels::GraphScratch & scratch);
    // Allocates the frame's graph (a fresh plan when asked), sets its inputs and computes it.
    void compute(GraphFrame & frame, ggml_tensor * out, bool fresh_plan, int n_threads, int64_t n_tokens,
                 const std::function<void()> & set_inputs);

    const Model & model_;
    EngineOptions opts_;
    ggml_backend_ptr own_backend_;             // with options().n_threads > 0 (else the model's is used)
    ggml_gallocr_ptr galloc_;                  // the compute buffer's allocator
    ggml_backend_buffer_ptr scratch_buf_;      // the kernels' scratch (kernels/scratch.h)
    std::vector<uint8_t> graph_meta_;          // storage for graph and tensor metadata
    std::pair<const void *, size_t> advised_;  // the compute buffer given huge-page advice
};

}  // namespace kvlab
