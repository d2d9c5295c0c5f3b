// ComputeGate: bounds how many contexts compute at once; the most lagging waiter goes first.
#pragma once

#include "busy_clock.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

namespace bevy {

class ComputeGate {
public:
    explicit ComputeGate(int32_t capacity) : capacity_(capacity) {}

    // Block until fewer than capacity contexts compute and no waiter has a smaller key, or until
    // timeout_ms passed (0: no limit). key orders waiters: (token, layer, context) packed so that
    // smaller = further behind. true: entered; false: timed out, not entered.
    bool enter(uint64_t key, int32_t timeout_ms = 0);
    void leave();

    void    set_capacity(int32_t capacity);
    int32_t capacity() const { return capacity_; }

    // nanoseconds during which at least one context computed
    uint64_t busy_ns();

private:
    std::mutex              mutex_;
    std::condition_variable cv_;
    std::set<uint64_t>      waiting_;
    BusyClock               busy_;  // active() = contexts computing now
    int32_t                 capacity_;
};

// the priority key of a context about to compute `layer` of token `token`
inline uint64_t gate_key(int64_t token, int32_t layer, int32_t context) {
    // context ids are reused as contexts come and go (ExpertCache::register_context), so they stay
    // below the contexts alive at once: 16 bits is 65,536 of them
    return ((uint64_t) token << 32) | ((uint64_t) (uint16_t) (layer + 1) << 16) | (uint16_t) context;
}

} // namespace bevy
