// UploadQueue: worker threads that run load jobs, most urgent first.
#pragma once

#include "busy_clock.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace bevy {

struct LoadJob {
    int64_t slot;      // -1: chosen when a worker takes the job (a scheduler's load)
    int32_t layer;
    int32_t expert;
    uint64_t priority; // smaller = more urgent: demand loads by (token, layer), prefetch after all
    int32_t owner = -1; // the scheduler whose reservations hold the slot once chosen
};

class UploadQueue {
public:
    using Runner = std::function<void(const LoadJob &, int32_t worker)>;

    UploadQueue(int32_t n_workers, Runner run);
    ~UploadQueue(); // orderly: stop, wake, join

    UploadQueue(const UploadQueue &)            = delete;
    UploadQueue & operator=(const UploadQueue &) = delete;

    void push(const LoadJob & job);

    // nanoseconds during which at least one job was running
    uint64_t busy_ns() const;

private:
    struct Entry {
        LoadJob  job;
        uint64_t order;
        bool operator<(const Entry & o) const { // priority_queue pops the largest
            return job.priority != o.job.priority ? job.priority > o.job.priority : order > o.order;
        }
    };

    void worker(int32_t index);

    std::mutex                        mutex_;
    std::condition_variable           cv_;
    std::priority_queue<Entry>        jobs_;
    uint64_t                          order_ = 0;
    bool                              stop_  = false;
    Runner                            run_;
    std::vector<std::thread>          workers_;

    mutable std::mutex                       busy_mutex_;
    BusyClock                                busy_;  // link busy: at least one job running
};

} // namespace bevy
