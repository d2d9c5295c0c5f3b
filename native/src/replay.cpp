// bevy_replay (include/bevy.h): a policy's hits on a recorded access order, run by the live
// cache's own SlotDirectory, so a replayed hit rate is what the live cache would see.
#include "capi_common.hpp"
#include "slot_directory.hpp"

#include <algorithm>
#include <vector>

using bevy::capi::guarded;
using bevy::capi::last_error;

int64_t bevy_replay(int32_t policy, int32_t n_layer, int32_t n_expert, int64_t n_slots, uint64_t seed,
                    const int32_t * layers, const int64_t * offsets, const int32_t * experts, int64_t n_steps) {
    return guarded([&]() -> int64_t {
        bevy::SlotDirectory dir(n_layer, n_expert, n_slots, static_cast<bevy::Policy>(policy), seed);
        std::vector<int64_t> pinned;
        std::vector<uint8_t> used(n_expert);
        int64_t hits = 0;
        for (int64_t i = 0; i < n_steps; ++i) {
            for (int64_t s : pinned) {
                dir.unpin(s);
            }
            pinned.clear();
            std::fill(used.begin(), used.end(), 0);
            const int32_t il = layers[i];
            const std::vector<int32_t> now = { il };
            // as the live cache: pin the resident experts first, then load the rest
            for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
                used[experts[j]] = 1;
                const int64_t s = dir.find(il, experts[j]);
                if (s >= 0) {
                    hits++;
                    dir.pin(s);
                    dir.touch(s);
                    pinned.push_back(s);
                }
            }
            for (int64_t j = offsets[i]; j < offsets[i + 1]; ++j) {
                if (dir.find(il, experts[j]) >= 0) {
                    continue;
                }
                bool evicted = false;
                const int64_t s = dir.assign(il, experts[j], now, &evicted);
                if (s < 0) {
                    last_error() = "a step needs more experts than the cache has slots";
                    return -1;
                }
                dir.set_state(s, bevy::SlotState::Ready); // loads are instant in a replay
                dir.pin(s);
                dir.touch(s);
                pinned.push_back(s);
            }
            dir.visit(il, used);
        }
        return hits;
    }, -1);
}
