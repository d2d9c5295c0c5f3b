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

    // Block until the contexts computing leave room for `weight` more (of capacity; a weight of
    // capacity or more computes alone: a call on every thread) and no waiter has a smaller key, or
    // until timeout_ms passed (0: no limit). key orders waiters: (token, layer, context) packed so
    // that smaller = further behind. or_one: at its turn it takes `weight` if no context computes,
    // else 1 (it never waits for the room of more). The weight it entered with; 0: timed out.
    int32_t enter(uint64_t key, int32_t timeout_ms = 0, int32_t weight = 1, bool or_one = false);
    void leave(int32_t weight = 1);  // the weight it entered with

    void    set_capacity(int32_t capacity);
    int32_t capacity() const { return capacity_; }

    // nanoseconds during which at least one context computed
    uint64_t busy_ns();
    // nanoseconds of the whole capacity computing: each stretch weighted by the share of the
    // capacity in use (contexts' weights over the capacity, at most 1), so that lanes computing on
    // a share of the threads each count as that share of the machine
    uint64_t used_ns();

private:
    void account(); // adds the stretch since the last change to used_ns_ (mutex held)

    std::mutex              mutex_;
    std::condition_variable cv_;
    std::set<uint64_t>      waiting_;
    BusyClock               busy_;      // active() = contexts computing now
    int32_t                 used_ = 0;  // their weights, summed
    int32_t                 capacity_;
    double                  used_ns_ = 0.0;
    std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
};

// the priority key of a context about to compute `layer` of token `token`
inline uint64_t gate_key(int64_t token, int32_t layer, int32_t context) {
    // context ids are reused as contexts come and go (ExpertCache::register_context), so they stay
    // below the contexts alive at once: 16 bits is 65,536 of them
    return ((uint64_t) token << 32) | ((uint64_t) (uint16_t) (layer + 1) << 16) | (uint16_t) context;
}

} // namespace bevy
