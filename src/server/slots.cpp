#include "server/slots.h"

#include <algorithm>
#include <chrono>

#include "server/api_error.h"

namespace kvlab::server {

Slots::Slots(const Model & model, int n_slots, int max_queue, double timeout_s, EngineOptions opts)
    : busy_(size_t(n_slots), false), max_queue_(max_queue), timeout_s_(timeout_s) {
    for (int i = 0; i < n_slots; ++i) engines_.push_back(std::make_unique<Engine>(model, opts));
}

std::unique_ptr<Slots::Lease> Slots::acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto free_slot = [&] { return std::find(busy_.begin(), busy_.end(), false); };
    if (free_slot() == busy_.end()) {
        if (waiting_ >= max_queue_)
            throw ApiError(503, "the server is busy: every slot is working and the queue is full; retry later", "",
                           "server_busy");
        ++waiting_;
        const bool got =
            cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return free_slot() != busy_.end(); });
        --waiting_;
        if (!got) throw ApiError(503, "no slot became free within the queue timeout; retry later", "", "queue_timeout");
    }
    const size_t i = size_t(free_slot() - busy_.begin());
    busy_[i] = true;
    return std::make_unique<Lease>(*this, i);
}

void Slots::release(size_t i) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        busy_[i] = false;
    }
    cv_.notify_one();
}

int Slots::busy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return int(std::count(busy_.begin(), busy_.end(), true));
}

int Slots::waiting() const {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
}

}  // namespace kvlab::server
