// Continuous batching over one engine (docs/serving.md): requests join and leave between steps;
// each step is one graph (Engine::eval_batch) for every active request, a new request's query
// prefilled a chunk per step beside the others' decoding. A request's tokens, logits and
// log-probabilities are those Engine::generate gives it alone (the same greedy path, the same
// samples from the same seed), where the products give the same bits at every batch size.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "kvlab/engine.h"

namespace kvlab {

class BatchDecoder {
public:
    // chunk: the most query tokens a request prefills in one step (a decode step of the others
    // waits for at most that); max_batch: the most requests in one step (the others wait their turn).
    BatchDecoder(Engine & engine, int64_t chunk = 64, int max_batch = 64);

    // A request on `cache` (not owned; nothing else may touch it until the request is taken):
    // query prefilled on top of it, then up to opts.max_tokens tokens sampled. on_token as in
    // Engine::generate (false: stop, reason "caller"). opts.decode and teacher forcing are not
    // taken (a policy compacts between one request's steps: Engine::generate). Returns its id.
    // Throws kvlab::Error for an empty query or no room left in the model's context.
    int64_t add(KvStore & cache, std::vector<int32_t> query, const GenerateOptions & opts,
                std::function<bool(int32_t)> on_token = {});
    // Stops a request before its next step (stop reason "caller").
    void cancel(int64_t id);

    // One graph for the active requests (up to max_batch) whose caches have the row types of the
    // one that waited longest (a batch is of one CacheTypes; the others take the next step); false
    // when none was active. Throws what Engine::eval_batch throws (no cache changed).
    bool step();
    // Steps until every request is done.
    void run();

    bool done(int64_t id) const;
    GenerateResult take(int64_t id);                // a request that is done: its result, forgotten here
    int active() const;                             // requests not done
    int last_batch() const { return last_batch_; }  // requests in the last step

private:
    struct Request {
        KvStore * cache = nullptr;
        std::vector<int32_t> query;
        size_t prefilled = 0;  // query tokens through the model
        GenerateOptions opts;
        std::function<bool(int32_t)> on_token;
        std::mt19937_64 rng;
        std::vector<float> logits;
        int32_t last = -1;  // the token the next step feeds
        int32_t max_tokens = 0;
        double t0 = 0.0, t_first = 0.0;
        bool done = false, cancelled = false;
        uint64_t last_step = 0;  // the step it last took part in (0: none yet)
        GenerateResult r;
    };
    // The request's logits after a step: samples, records, and decides whether it goes on.
    void after_step(Request & q);
    void finish(Request & q, const char * reason);

    Engine & engine_;
    int64_t chunk_;
    int max_batch_;
    int64_t next_id_ = 0;
    uint64_t steps_ = 0;
    int last_batch_ = 0;
    std::map<int64_t, Request> requests_;  // by id: the oldest first
    std::vector<int32_t> ids_;             // token_logprobs' scratch
};

}  // namespace kvlab
