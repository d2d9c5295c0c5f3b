// SlotDirectory: which expert each slot of the pool holds, pins, and who to evict.
//
// Pure bookkeeping, no data and no locking (the caller holds the cache's mutex): the live
// cache and the trace replay run the same code, so a replayed hit rate is the live one.
#pragma once

#include "bevy.h"

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace bevy {

// the eviction policies of bevy.h (enum bevy_policy)
enum class Policy : int32_t {
    Lru     = BEVY_POLICY_LRU,      // reference: least recently used
    NextUse = BEVY_POLICY_NEXT_USE, // default: evict the expert whose estimated next use is furthest away
    Random  = BEVY_POLICY_RANDOM,   // for stress tests
};

enum class SlotState : uint8_t { Empty, Loading, Ready };

class SlotDirectory {
public:
    SlotDirectory(int32_t n_layer, int32_t n_expert, int64_t n_slots, Policy policy, uint64_t seed);

    int32_t n_layer() const { return n_layer_; }
    int32_t n_expert() const { return n_expert_; }
    int64_t n_slots() const { return (int64_t) slots_.size(); }

    // slot holding (il, e), or -1
    int64_t find(int32_t il, int32_t e) const { return key_slot_[key(il, e)]; }

    // layer il's experts take slots [begin, end) (its slot class; default: every slot)
    void set_layer_slots(int32_t il, int64_t begin, int64_t end) { layer_slots_[il] = { begin, end }; }

    // A slot to reuse for (il, e) among il's slots: an empty one, else the policy's victim among
    // the unpinned ready slots. Next use is the soonest visit of a layer by any context computing a layer
    // in `now` or waiting to compute a layer in `upcoming`. -1 when every slot is pinned or
    // loading. The slot is unmapped from its old expert and mapped to (il, e), state Loading.
    int64_t assign(int32_t il, int32_t e, const std::vector<int32_t> & now, bool * evicted,
                   const std::vector<int32_t> & upcoming = {});

    void set_state(int64_t slot, SlotState s) { slots_[slot].state = s; }
    // is some slot of layer il's loading (it becomes evictable when its load completes)?
    bool any_loading(int32_t il) const;
    SlotState state(int64_t slot) const { return slots_[slot].state; }

    // forget the expert of a slot (a failed load)
    void clear(int64_t slot);

    void pin(int64_t slot) { slots_[slot].pins++; }
    void unpin(int64_t slot) { slots_[slot].pins--; }
    int32_t pins(int64_t slot) const { return slots_[slot].pins; }

    // a use of slot by a request at its layer (LRU clock)
    void touch(int64_t slot) { slots_[slot].last_use = ++clock_; }

    // one visit of layer il that used the experts flagged in used[e] (next-use frequencies)
    void visit(int32_t il, const std::vector<uint8_t> & used);

    // (il, e) is needed by one more (delta +1) or one fewer (-1) flight whose router revealed it:
    // next-use eviction takes a revealed expert only when no unrevealed one is left to take
    void reveal(int32_t il, int32_t e, int32_t delta) { revealed_[key(il, e)] += delta; }

private:
    struct Slot {
        int32_t   key      = -1;
        int32_t   pins     = 0;
        uint64_t  last_use = 0;
        SlotState state    = SlotState::Empty;
    };

    int32_t key(int32_t il, int32_t e) const { return il * n_expert_ + e; }
    double  next_use(int32_t k, const std::vector<int32_t> & now, const std::vector<int32_t> & upcoming) const;

    int32_t              n_layer_;
    int32_t              n_expert_;
    Policy               policy_;
    std::vector<Slot>    slots_;
    std::vector<std::pair<int64_t, int64_t>> layer_slots_; // per layer: the slots its experts may take
    std::vector<int64_t> key_slot_;
    std::vector<float>   freq_;  // per key: moving average of "used at a visit of its layer"
    std::vector<int32_t> revealed_; // per key: flights (of every owner) whose routers asked for it
    uint64_t             clock_ = 0;
    std::mt19937_64      rng_;
};

} // namespace bevy
