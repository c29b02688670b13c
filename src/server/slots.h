// The server's engines ("slots", as llama-server calls them): N engines on one model, its
// weights shared, each computing on its own CPU backend; a request holds one while it
// prefills or generates. Requests wait for a free slot in a bounded queue: a full queue
// answers 503 at once, a wait longer than the timeout 503 too.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "kvlab/engine.h"

namespace kvlab::server {

class Slots {
public:
    Slots(const Model & model, int n_slots, int max_queue, double timeout_s, EngineOptions opts);

    class Lease {
    public:
        Lease(Slots & s, size_t i) : s_(s), i_(i) {}
        Lease(const Lease &) = delete;
        Lease & operator=(const Lease &) = delete;
        ~Lease() { s_.release(i_); }
        Engine & engine() { return *s_.engines_[i_]; }

    private:
        Slots & s_;
        size_t i_;
    };
    // A free slot, waiting in the queue for one; throws ApiError(503) when the queue is full
    // or the wait times out.
    std::unique_ptr<Lease> acquire();

    int size() const { return int(engines_.size()); }
    int busy() const;
    int waiting() const;

private:
    void release(size_t i);
    std::vector<std::unique_ptr<Engine>> engines_;
    std::vector<bool> busy_;
    int max_queue_;
    double timeout_s_;
    int waiting_ = 0;
    mutable std::mutex mu_;
    std::condition_variable cv_;
};

}  // namespace kvlab::server
