#include "upload_queue.hpp"

namespace bevy {

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
        run_(job, index);
        {
            std::lock_guard<std::mutex> lock(busy_mutex_);
            busy_.stop();
        }
    }
}

uint64_t UploadQueue::busy_ns() const {
    std::lock_guard<std::mutex> lock(busy_mutex_);
    return busy_.ns();
}

} // namespace bevy
