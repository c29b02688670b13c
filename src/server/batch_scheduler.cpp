#include "server/batch_scheduler.h"

#include <algorithm>

#include "kvlab/error.h"

namespace kvlab::server {

// A request between its connection's thread and the loop; every field under the scheduler's mutex.
struct BatchScheduler::Pending {
    KvStore * cache = nullptr;
    std::vector<int32_t> query;
    GenerateOptions opts;
    std::deque<int32_t> tokens;  // sampled, not yet taken by the connection
    bool cancel = false, done = false;
    std::string error;
    GenerateResult result;
    std::condition_variable changed;
};

struct BatchScheduler::Job {
    std::function<void()> fn;
    std::exception_ptr error;
    bool done = false;
    std::condition_variable finished;
};

BatchScheduler::BatchScheduler(const Model & model, EngineOptions eo, int max_batch, int64_t chunk)
    : engine_(model, eo), decoder_(engine_, chunk, max_batch), thread_([this] { loop(); }) {}

BatchScheduler::~BatchScheduler() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_.notify_all();
    thread_.join();
}

GenerateResult BatchScheduler::generate(KvStore & cache, std::vector<int32_t> query, const GenerateOptions & opts,
                                        const std::function<bool(int32_t)> & on_token) {
    auto p = std::make_shared<Pending>();
    p->cache = &cache;
    p->query = std::move(query);
    p->opts = opts;
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) throw Error("serve", "the server is stopping");
    incoming_.push_back(p);
    work_.notify_all();
    // until the loop is done with the cache: a cancelled request still waits for its last step
    size_t delivered = 0;  // tokens handed to on_token, the one that stopped it included
    for (;;) {
        p->changed.wait(lock, [&] { return p->done || !p->tokens.empty(); });
        while (!p->tokens.empty()) {
            const int32_t tok = p->tokens.front();
            p->tokens.pop_front();
            if (p->cancel || !on_token) continue;
            ++delivered;
            lock.unlock();
            const bool go_on = on_token(tok);
            lock.lock();
            if (!go_on) p->cancel = true;
        }
        if (p->done) break;
    }
    if (!p->error.empty()) throw Error("serve", p->error);
    GenerateResult r = std::move(p->result);
    if (p->cancel) {  // the tokens the loop made before it saw the stop are not the answer's
        r.stop_reason = "caller";
        r.tokens.resize(std::min(r.tokens.size(), delivered));
        r.logprobs.resize(std::min(r.logprobs.size(), delivered));
    }
    return r;
}

void BatchScheduler::run(const std::function<void()> & job) {
    auto j = std::make_shared<Job>();
    j->fn = job;
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) throw Error("serve", "the server is stopping");
    jobs_.push_back(j);
    work_.notify_all();
    j->finished.wait(lock, [&] { return j->done; });
    if (j->error) std::rethrow_exception(j->error);
}

BatchScheduler::Counts BatchScheduler::counts() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
}

void BatchScheduler::loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        work_.wait(lock, [&] { return stop_ || !incoming_.empty() || !running_.empty() || !jobs_.empty(); });
        while (!jobs_.empty()) {  // (also while stopping: their callers wait for them)
            std::shared_ptr<Job> j = jobs_.front();
            jobs_.pop_front();
            lock.unlock();
            try {
                j->fn();
            } catch (...) {
                j->error = std::current_exception();
            }
            lock.lock();
            j->done = true;
            j->finished.notify_all();
        }
        if (stop_) {
            for (auto & [id, p] : running_) decoder_.cancel(id);
            for (auto & p : incoming_) {
                p->error = "the server is stopping";
                p->done = true;
                p->changed.notify_all();
            }
            incoming_.clear();
            if (running_.empty()) return;
        }
        for (auto & p : incoming_) {
            try {
                std::weak_ptr<Pending> w = p;
                const int64_t id = decoder_.add(*p->cache, p->query, p->opts, [this, w](int32_t tok) {
                    // the step runs without the mutex: the token is handed over under it
                    std::lock_guard<std::mutex> g(mu_);
                    auto q = w.lock();
                    if (!q || q->cancel) return false;
                    q->tokens.push_back(tok);
                    q->changed.notify_all();
                    return true;
                });
                running_.emplace(id, p);
            } catch (const Error & e) {
                p->error = e.what();
                p->done = true;
                p->changed.notify_all();
            }
        }
        incoming_.clear();
        for (auto & [id, p] : running_)
            if (p->cancel) decoder_.cancel(id);
        lock.unlock();
        std::string failed;
        try {
            decoder_.step();
        } catch (const std::exception & e) {  // no cache changed: every running request ends with it
            failed = e.what();
        }
        lock.lock();
        if (!failed.empty())
            for (auto & [id, p] : running_) {
                p->error = failed;
                decoder_.cancel(id);
            }
        if (decoder_.last_batch() > 0) {
            ++counts_.steps;
            counts_.last_batch = decoder_.last_batch();
            counts_.batched_rows += uint64_t(decoder_.last_batch());
        }
        for (auto it = running_.begin(); it != running_.end();) {
            if (!decoder_.done(it->first)) {
                ++it;
                continue;
            }
            Pending & p = *it->second;
            p.result = decoder_.take(it->first);
            p.done = true;
            p.changed.notify_all();
            it = running_.erase(it);
        }
        counts_.running = int(running_.size());
    }
}

}  // namespace kvlab::server
