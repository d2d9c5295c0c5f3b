#include "upload_queue.hpp"

#include "event_log.hpp"

#include <cmath>
#include <iterator>

namespace bevy {

namespace {
constexpr double kJobTimeDecay = 0.1; // a job's time moves the average a tenth of the way
}

UploadQueue::UploadQueue(int32_t n_workers, Runner run) : run_(std::move(run)) {
    for (int32_t i = 0; i < n_workers; ++i) {
        workers_.emplace_back([this, i] { worker(i); });
    }
}

UploadQueue::~UploadQueue() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto & w : workers_) {
        w.join();
    }
}

void UploadQueue::push(const LoadJob & job) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        jobs_.push({job, order_++});
        outstanding_.insert(job.priority);
    }
    cv_.notify_one();
}

void UploadQueue::worker(int32_t index) {
    for (;;) {
        LoadJob job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
            if (stop_) {
                return; // pending jobs are dropped: the cache is going away
            }
            job = jobs_.top().job;
            jobs_.pop();
        }
        {
            std::lock_guard<std::mutex> lock(busy_mutex_);
            busy_.start();
        }
        const int64_t t0 = now_ns();
        const bool moved = run_(job, index);
        const double took = (double) (now_ns() - t0);
        {
            std::lock_guard<std::mutex> lock(busy_mutex_);
            busy_.stop();
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            outstanding_.erase(outstanding_.find(job.priority));
            if (moved) {
                job_ns_ = job_ns_ == 0 ? took : job_ns_ + kJobTimeDecay * (took - job_ns_);
            }
        }
    }
}

int64_t UploadQueue::eta_ns(uint64_t priority) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto ahead = std::distance(outstanding_.begin(), outstanding_.upper_bound(priority));
    if (ahead == 0) {
        return 0;
    }
    const double rounds = std::ceil((double) ahead / (double) workers_.size());
    return (int64_t) (rounds * job_ns_);
}

int64_t UploadQueue::job_ns() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return (int64_t) job_ns_;
}

uint64_t UploadQueue::busy_ns() const {
    std::lock_guard<std::mutex> lock(busy_mutex_);
    return busy_.ns();
}

} // namespace bevy
