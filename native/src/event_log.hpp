// EventLog: what contexts and the link did over time, for timelines (off unless enabled).
#pragma once

#include "bevy.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

namespace bevy {

// the kinds (BEVY_EVENT_*) and the record (bevy_event) are bevy.h's
constexpr int32_t kEventWait    = BEVY_EVENT_WAIT;
constexpr int32_t kEventCompute = BEVY_EVENT_COMPUTE;
constexpr int32_t kEventLoad    = BEVY_EVENT_LOAD;
using Event = bevy_event;

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
