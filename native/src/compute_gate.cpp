#include "compute_gate.hpp"

namespace bevy {

void ComputeGate::enter(uint64_t key) {
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.insert(key);
    cv_.wait(lock, [&] { return busy_.active() < capacity_ && *waiting_.begin() == key; });
    waiting_.erase(key);
    busy_.start();
    cv_.notify_all(); // the next waiter may fit too
}

void ComputeGate::leave() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        busy_.stop();
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
    return busy_.ns();
}

} // namespace bevy
