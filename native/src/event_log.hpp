// EventLog: what contexts and the link did over time, for timelines (off unless enabled).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace bevy {

enum EventKind : int32_t {
    kEventWait    = 0, // a context waits for its experts (or for the compute gate) at a layer
    kEventCompute = 1, // a context computes a layer (from its experts' arrival to the next layer)
    kEventLoad    = 2, // a link transfer of one expert (context = upload worker)
};

struct Event {
    int32_t kind;
    int32_t context;
    int32_t layer;
    int32_t expert;
    int64_t t0_ns; // steady clock (CLOCK_MONOTONIC), as Python's time.perf_counter_ns / monotonic_ns
    int64_t t1_ns;
};

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}

class EventLog {
public:
    void enable(int64_t max_events) {
        std::lock_guard<std::mutex> lock(mutex_);
        max_ = max_events > 0 ? (size_t) max_events : 0;
        events_.clear();
        events_.reserve(max_);
        on_ = max_ > 0;
    }

    bool on() const { return on_.load(std::memory_order_relaxed); }

    void add(const Event & e) {
        if (!on()) {
            return;
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (events_.size() < max_) {
            events_.push_back(e);
        }
    }

    // moves up to max events into out, oldest first; returns how many
    int64_t drain(Event * out, int64_t max) {
        std::lock_guard<std::mutex> lock(mutex_);
        const int64_t n = std::min<int64_t>(max, (int64_t) events_.size());
        std::copy(events_.begin(), events_.begin() + n, out);
        events_.erase(events_.begin(), events_.begin() + n);
        return n;
    }

private:
    std::mutex         mutex_;
    std::vector<Event> events_;
    size_t             max_ = 0;
    std::atomic<bool>  on_{false};
};

} // namespace bevy
