#include "compute_gate.hpp"

namespace bevy {

bool ComputeGate::enter(uint64_t key, int32_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.insert(key);
    const auto turn = [&] { return busy_.active() < capacity_ && *waiting_.begin() == key; };
    bool entered = true;
    if (timeout_ms > 0) {
        entered = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), turn);
    } else {
        cv_.wait(lock, turn);
    }
    waiting_.erase(key);
    if (entered) {
        busy_.start();
    }
    cv_.notify_all(); // the next waiter may fit too (or be first now that this one gave up)
    return entered;
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
