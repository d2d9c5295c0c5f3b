#include "compute_gate.hpp"

#include <algorithm>

namespace bevy {

int32_t ComputeGate::enter(uint64_t key, int32_t timeout_ms, int32_t weight, bool or_one) {
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.insert(key);
    // a weight above the capacity waits for every context to leave (never for more)
    const auto turn = [&] {
        const int32_t need = or_one ? 1 : weight;
        return (used_ == 0 || used_ + need <= capacity_) && *waiting_.begin() == key;
    };
    bool entered = true;
    if (timeout_ms > 0) {
        entered = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), turn);
    } else {
        cv_.wait(lock, turn);
    }
    waiting_.erase(key);
    if (entered) {
        weight = or_one && used_ > 0 ? 1 : weight;
        account();
        busy_.start();
        used_ += weight;
    }
    cv_.notify_all(); // the next waiter may fit too (or be first now that this one gave up)
    return entered ? weight : 0;
}

void ComputeGate::leave(int32_t weight) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        account();
        busy_.stop();
        used_ -= weight;
    }
    cv_.notify_all();
}

void ComputeGate::set_capacity(int32_t capacity) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        account();
        capacity_ = capacity;
    }
    cv_.notify_all();
}

uint64_t ComputeGate::busy_ns() {
    std::lock_guard<std::mutex> lock(mutex_);
    return busy_.ns();
}

uint64_t ComputeGate::used_ns() {
    std::lock_guard<std::mutex> lock(mutex_);
    account();
    return (uint64_t) used_ns_;
}

void ComputeGate::account() {
    const auto now = std::chrono::steady_clock::now();
    if (used_ > 0 && capacity_ > 0) {
        const double share = std::min(1.0, (double) used_ / capacity_);
        used_ns_ += share * (double) std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark_).count();
    }
    mark_ = now;
}

} // namespace bevy
