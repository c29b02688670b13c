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
    std::map<int64_t, std::shared_ptr<Pending>> running_;  // by decoder id
    Counts counts_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace kvlab::server
