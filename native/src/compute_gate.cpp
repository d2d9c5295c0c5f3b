#include "compute_gate.hpp"

namespace bevy {

void ComputeGate::enter(uint64_t key) {
    std::unique_lock<std::mutex> lock(mutex_);
    waiting_.insert(key);
    cv_.wait(lock, [&] { return active_ < capacity_ && *waiting_.begin() == key; });
    waiting_.erase(key);
    active_++;
    cv_.notify_all(); // the next waiter may fit too
}

void ComputeGate::leave() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        active_--;
    }
    cv_.notify_all();
}

} // namespace bevy
