// The server's decoding loop (continuous batching, docs/serving.md): the requests of every
// connection decode together on one engine, one graph per step (BatchDecoder), so the weights
// are read once per step for all of them. A connection's thread hands its request over and waits
// for its tokens, which it turns into text and writes itself: a client that stops reading stalls
// its own thread, never the loop.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvlab/batch_decoder.h"
#include "kvlab/engine.h"

namespace kvlab::server {

class BatchScheduler {
public:
    // max_batch: the most requests in one step; chunk: the most query tokens one request
    // prefills in a step (what the others' next token waits for at most).
    BatchScheduler(const Model & model, EngineOptions eo, int max_batch, int64_t chunk);
    ~BatchScheduler();  // finishes the loop (requests still running end as "caller")
    BatchScheduler(const BatchScheduler &) = delete;
    BatchScheduler & operator=(const BatchScheduler &) = delete;

    // Runs one request in the loop and returns when it is done; on_token runs on this thread as
    // the tokens arrive (false: the request stops before its next step). `cache` is the request's
    // alone until this returns. Throws kvlab::Error as BatchDecoder::add does, or what a step threw.
    GenerateResult generate(KvStore & cache, std::vector<int32_t> query, const GenerateOptions & opts,
                            const std::function<bool(int32_t)> & on_token);

    // Runs job on the loop's thread between two steps and returns when it is done (its exception
    // rethrown here): every graph of the server then computes on one thread. ggml computes with
    // OpenMP, whose runtime keeps a team of threads per thread that starts a parallel region; with
    // a second such thread (a context made on a connection's thread) the process holds more
    // OpenMP threads than CPUs and libgomp stops spinning at barriers: a decode step's few hundred
    // barriers each became a sleep and a wake, and decode ran at half speed (smollm2-135m, 2
    // threads, AMD EPYC Zen 4: 61 instead of 127 tok/s after a context was made). The steps wait
    // while a job runs.
    void run(const std::function<void()> & job);
    // The loop's engine (every thread), for a job to compute with: only inside run().
    Engine & engine() { return engine_; }

    struct Counts {
        uint64_t steps = 0;         // graphs run
        uint64_t batched_rows = 0;  // requests summed over the steps
        int last_batch = 0;         // requests in the last step
        int running = 0;            // requests in the loop now
    };
    Counts counts() const;

private:
    struct Pending;
    void loop();

    Engine engine_;
    BatchDecoder decoder_;
    mutable std::mutex mu_;
    std::condition_variable work_;
    std::vector<std::shared_ptr<Pending>> incoming_;
    struct Job;
    std::deque<std::shared_ptr<Job>> jobs_;
    std::map<int64_t, std::shared_ptr<Pending>> running_;  // by decoder id
    Counts counts_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace kvlab::server
