#include "compute_gate.hpp"

namespace bevy {

void ComputeGate::enter(uint64_t key) {
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.insert(key);
    cv_.wait(lock, [&] { return active_ < capacity_ && *waiting_.begin() == key; });
    waiting_.erase(key);
    if (active_++ == 0) {
        busy_since_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all(); // the next waiter may fit too
}

void ComputeGate::leave() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--active_ == 0) {
            busy_ns_ += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - busy_since_).count();
        }
    }
    cv_.notify_all();
}

void ComputeGate::set_capacity(int32_t capacity) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        capacity_ = capacity;
    }
    cv_.notify_all();
}

uint64_t ComputeGate::busy_ns() {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t ns = busy_ns_;
    if (active_ > 0) {
        ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - busy_since_).count();
    }
    return ns;
}

} // namespace bevy
