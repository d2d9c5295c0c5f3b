// BusyClock: how long at least one of several activities was under way (the caller locks).
#pragma once

#include <chrono>
#include <cstdint>

namespace bevy {

class BusyClock {
public:
    // an activity starts / ends
    void start() {
        if (active_++ == 0) {
            since_ = std::chrono::steady_clock::now();
        }
    }
    void stop() {
        if (--active_ == 0) {
            ns_ += elapsed();
        }
    }

    bool    any() const { return active_ > 0; }
    int32_t active() const { return active_; }

    // nanoseconds with at least one activity under way, the current stretch included
    uint64_t ns() const { return ns_ + (active_ > 0 ? elapsed() : 0); }

private:
    uint64_t elapsed() const {
        return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - since_).count();
    }

    int32_t                               active_ = 0;
    uint64_t                              ns_     = 0;
    std::chrono::steady_clock::time_point since_{};
};

} // namespace bevy
