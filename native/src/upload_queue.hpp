// UploadQueue: worker threads that run load jobs, most urgent first.
#pragma once

#include "busy_clock.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <set>
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
    // runs one job; false: it moved nothing (its time does not count towards a job's)
    using Runner = std::function<bool(const LoadJob &, int32_t worker)>;

    UploadQueue(int32_t n_workers, Runner run);
    ~UploadQueue(); // orderly: stop, wake, join

    UploadQueue(const UploadQueue &)            = delete;
    UploadQueue & operator=(const UploadQueue &) = delete;

    void push(const LoadJob & job);

    // nanoseconds during which at least one job was running
    uint64_t busy_ns() const;

    // When the jobs of priority `priority` (or more urgent) will have run, from now: the jobs
    // queued or running at that priority or better, n_workers at a time, each taking the
    // recent average of a job's time (0 with none outstanding).
    int64_t eta_ns(uint64_t priority) const;
    int32_t n_workers() const { return (int32_t) workers_.size(); }
    // the recent average time of a job that moved bytes (0 before any)
    int64_t job_ns() const;

private:
    struct Entry {
        LoadJob  job;
        uint64_t order;
        bool operator<(const Entry & o) const { // priority_queue pops the largest
            return job.priority != o.job.priority ? job.priority > o.job.priority : order > o.order;
        }
    };

    void worker(int32_t index);

    mutable std::mutex                mutex_;
    std::condition_variable           cv_;
    std::priority_queue<Entry>        jobs_;
    std::multiset<uint64_t>           outstanding_; // priorities of the jobs queued or running
    double                            job_ns_ = 0;  // moving average of a job's time (0: none ran yet)
    uint64_t                          order_ = 0;
    bool                              stop_  = false;
    Runner                            run_;
    std::vector<std::thread>          workers_;

    mutable std::mutex                       busy_mutex_;
    BusyClock                                busy_;  // link busy: at least one job running
};

} // namespace bevy
