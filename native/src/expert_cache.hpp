// ExpertCache: a byte budget of slots in fast memory, filled over a link by an upload queue.
#pragma once

#include "bevy.h"
#include "compute_gate.hpp"
#include "event_log.hpp"
#include "links.hpp"
#include "slot_directory.hpp"
#include "upload_queue.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace bevy {

constexpr int32_t kMaxKinds = BEVY_MAX_KINDS;
constexpr int32_t kMaxClasses = BEVY_MAX_CLASSES;
constexpr int32_t kMaxOwners = 64; // schedulers sharing one cache

struct CacheConfig {
    int32_t  n_layer         = 0;
    int32_t  n_expert        = 0;
    int32_t  n_kinds         = 0;
    uint64_t kind_bytes[kMaxKinds] = {};
    int64_t  n_slots         = 0;
    Policy   policy          = Policy::NextUse;
    int32_t  n_workers       = 1;
    int32_t  wait_timeout_ms = 0;
    uint64_t seed            = 0;
    // slot classes (bevy.h): 0 or 1 means one, of kind_bytes and n_slots
    int32_t  n_classes       = 0;
    int64_t  class_slots[kMaxClasses] = {};
    uint64_t class_kind_bytes[kMaxClasses][kMaxKinds] = {};
    uint64_t class_kind_stride[kMaxClasses][kMaxKinds] = {}; // from one slot to the next (0: its kind's bytes)
    std::vector<int32_t> layer_class; // per layer (empty: every layer class 0)
    bool     external_slots  = false; // slot memory given by the caller (set_slot_data), written only by writers
};

// bevy.h's counters (BEVY_COUNTERS); a default-constructed one is all zeros
using Counters = bevy_counters;

// what a hook needs the cache to do at one layer
struct AcquireRequest {
    int32_t         il;
    const int32_t * experts;       // distinct
    int32_t         n;
    uint64_t        priority;      // of the demand loads (smaller = sooner)
    int32_t         context;       // registered context, or -1
    const int32_t * prefetch;      // distinct experts of layer il + 1 to load without waiting
    int32_t         n_prefetch;
    bool            count = true;  // count hits and misses (off when a scheduler counted them already)
    uint8_t *       ready = nullptr; // if set: do not wait; ready[i] = 1 for the experts already loaded
};

class ExpertCache {
public:
    ExpertCache(const CacheConfig & cfg, Link * link, std::string & err);
    ~ExpertCache();

    const CacheConfig & config() const { return cfg_; }
    bool ok() const { return ok_; }

    // expert e of kind k at layer il lies at offset + e * (kind k's bytes in il's class) in the slow tier
    void  set_source(int32_t il, int32_t kind, uint64_t offset) { sources_[(size_t) il * cfg_.n_kinds + kind] = offset; }
    // where layer il's expert of kind k starts inside its slot (bevy.h: bevy_cache_slot_phase)
    uint64_t slot_phase(int32_t il, int32_t kind) const;
    // how experts of kind k at layer il reach their slot: read straight in (fn NULL) or through fn
    struct SlotWriter {
        bevy_slot_writer_fn fn = nullptr;
        int32_t type = 0;
        int64_t ne0  = 0;
        int64_t ne1  = 0;
    };
    void  set_writer(int32_t il, int32_t kind, const SlotWriter & w) { writers_[(size_t) il * cfg_.n_kinds + kind] = w; }
    // where the workers' staging buffers come from (bevy_cache_set_staging); set before any load
    struct StagingAlloc {
        bevy_staging_alloc_fn alloc = nullptr;
        bevy_staging_free_fn  free  = nullptr;
        void *                user  = nullptr;
    };
    void  set_staging(const StagingAlloc & a) { staging_alloc_ = a; }
    int64_t staging_custom() const { return staging_custom_; } // staging buffers the allocator gave
    void * slot_data(int32_t c, int32_t kind) const { return memory_[(size_t) c * cfg_.n_kinds + kind]; }
    // external slots: the memory of kind k's slots of class c (never freed here)
    void  set_slot_data(int32_t c, int32_t kind, void * data) { memory_[(size_t) c * cfg_.n_kinds + kind] = data; }
    int32_t n_classes() const { return (int32_t) classes_.size(); }
    // the first slot of layer il's class: the tensors of il's layout index slots from there
    int64_t first_slot(int32_t il) const { return classes_[layer_class_[il]].first; }

    // Pin a slot for each of the n distinct experts of layer il (appending them to pins), issue
    // the prefetch loads, and wait until the pinned slots are loaded; slots[i] is experts[i]'s.
    // Returns 0, or -1 with err.
    int32_t acquire(const AcquireRequest & req, int64_t * slots, std::vector<int64_t> & pins, std::string & err);
    // wait until these slots (pinned by an acquire at layer il) are loaded; the wait counts as il's stall
    int32_t wait_loaded(int32_t il, const int64_t * slots, int32_t n, std::string & err);
    // n experts of layer il were computed in a second pass (counted as such)
    void count_second_pass(int32_t il, int64_t n);

    // contexts that share the cache: their layers steer next-use eviction. An unregistered id is
    // given to the next context, so the table (scanned at every eviction) holds at most as many
    // entries as contexts were ever alive at once, however many come and go.
    int32_t register_context();
    void    unregister_context(int32_t id);
    int32_t context_entries() const; // the table's size

    // router weights of layer il ([n_expert][n_embd], copied) for next-layer prediction
    void set_router(int32_t il, const float * w, int32_t n_embd);
    // layer il's router, or nullptr; n_embd its width
    const float * router(int32_t il, int32_t * n_embd) const;

    // a prediction for layer il against what it used (prefetch precision and recall)
    void score_prediction(int32_t il, uint64_t hits, uint64_t wasted, uint64_t missed);

    // unpin (and clear) pins
    void release(std::vector<int64_t> & pins);

    // a counter that changes whenever a load completes
    uint64_t version() const;
    // wait until version() != since or timeout; the wait counts as stall at layer il. true: changed
    bool wait_change(uint64_t since, int32_t timeout_ms, int32_t il);

    // One scheduling pass of an owner (a scheduler sharing the cache, numbered from 0), under
    // one lock (see bevy_cache_refresh): its upcoming layers are the flights', its old
    // reservations go, the admitted flights' resident experts are reserved and their absent
    // ones queued (in order, at their priorities; each takes its slot when the link starts it,
    // see assign_deferred), and absent[i] says how many experts flight i still lacks. -1 on a
    // bad owner, layer or expert id.
    int32_t refresh(int32_t owner, bevy_flight * flights, int32_t n, bevy_pass * pass);

    // per layer: lookups found resident and lookups that missed, so far
    void lookups(uint64_t * hits, uint64_t * misses, int32_t n_layer) const;

    // drop the reservations an owner's refresh made
    void    unreserve_all(int32_t owner);

    // off: hook calls pin and load as ever, but leave the eviction's statistics (usage
    // frequencies, recency) as they are: for decodes that are not the workload (calibrations)
    void set_learning(bool on) {
        std::lock_guard<std::mutex> lock(mutex_);
        learning_ = on;
    }

    // contexts whose hooks are gated compute at most `capacity` at once, lagging first
    ComputeGate & gate() { return gate_; }
    EventLog &    events() { return events_; }

    Counters counters(int32_t il) const; // il < 0: all layers
    int64_t  pinned() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return pinned_;
    }
    uint64_t link_busy_ns() const { return queue_->busy_ns(); }
    int64_t  load_ns() const { return queue_->job_ns(); }

private:
    bool make_classes(std::string & err); // classes_ and layer_class_ from the config; false (err set) if inconsistent
    std::chrono::steady_clock::time_point wait_deadline() const; // now + the wait timeout (or never)
    bool valid_layer(int32_t il, std::string & err) const;  // false (err set) outside the cache's layers
    int32_t timed_out(const char * what, int32_t il, std::string & err) const; // -1, err: a wait for `what` timed out
    int32_t wait_loaded_locked(std::unique_lock<std::mutex> & lock, int32_t il, const int64_t * slots, int32_t n,
                               std::chrono::steady_clock::time_point deadline, std::string & err);
    bool load(const LoadJob & job, int32_t worker); // false: nothing to load after all
    struct Staging {
        void *   data   = nullptr;
        uint64_t size   = 0;
        void *   handle = nullptr; // the staging allocator's (NULL: std::aligned_alloc's)
    };
    void * staging_buffer(int32_t worker, uint64_t nbytes); // per worker, for slot writers
    void   free_staging(Staging & buf);
    // A scheduler's load (queued without a slot, so that it evicts nothing while it waits its
    // turn): choose its slot now, reserved for the scheduler until its next refresh if that
    // refresh still wants it (so an owner never reserves more than its admitted flights need,
    // which the schedulers' no-deadlock rule counts on). false:
    // nothing to load (a hook loaded it meanwhile, or every slot is pinned or loading; the
    // scheduler asks again at its next refresh).
    bool assign_deferred(LoadJob & job);
    // With the mutex held: how many of the n distinct experts of layer il are not loaded yet;
    // with load, queue loads of the absent ones (at priority; their slots are chosen when a link
    // worker takes them, and join owner's reservations); with count, count the lookups.
    int32_t query_locked(int32_t il, const int32_t * experts, int32_t n, uint64_t priority, bool load, bool count,
                         int32_t owner = -1);
    // With the mutex held: take back an owner's reveals (SlotDirectory::reveal)
    void forget_revealed_locked(int32_t owner);

    CacheConfig             cfg_;
    Link *                  link_;
    bool                    ok_ = false;
    struct SlotClass {
        int64_t  first = 0;                 // its slots: [first, first + n)
        int64_t  n     = 0;
        uint64_t kind_bytes[kMaxKinds] = {}; // one expert, per kind
        uint64_t kind_stride[kMaxKinds] = {}; // from one slot to the next, per kind (at least its bytes)
        uint64_t bytes = 0;                  // one expert, all kinds
    };
    std::vector<SlotClass>  classes_;
    std::vector<int32_t>    layer_class_; // per layer
    std::vector<void *>     memory_;   // per (class, kind): its slots * its kind bytes (ours unless external_slots)
    std::vector<uint64_t>   sources_;  // per (layer, kind)
    std::vector<SlotWriter> writers_;  // per (layer, kind)
    std::vector<Staging>    staging_;  // per upload worker
    StagingAlloc            staging_alloc_;
    std::atomic<int64_t>    staging_custom_{0};

    mutable std::mutex      mutex_;
    std::condition_variable changed_;  // a slot became ready, failed, or was unpinned
    SlotDirectory           dir_;
    int64_t                 pinned_ = 0; // pins held in all
    std::vector<Counters>   layer_counters_;
    std::vector<uint8_t>    used_;       // scratch: experts used at this visit
    std::vector<std::string> load_errors_; // per slot: why its load failed
    std::vector<uint8_t>    requested_;  // per (layer, expert): a slotless load of it is queued
    uint64_t expert_bytes(int32_t il) const { return classes_[layer_class_[il]].bytes; } // one expert of layer il
    std::vector<int32_t>    positions_;  // per context id: the layer it computes (-1: idle, or no context)
    std::vector<int32_t>    free_ids_;   // context ids given back, for the next contexts
    std::vector<std::vector<int32_t>> upcoming_by_; // per owner: layers its flights compute next
    std::vector<int32_t>    upcoming_;   // every owner's together
    std::vector<std::vector<int64_t>> reserved_; // per owner: slots it pinned
    std::vector<uint8_t>    holding_;    // per owner: reservations in force (refreshed since its last unreserve_all)
    std::vector<std::vector<int32_t>> wanted_; // per owner: keys its admitted flights need (sorted), as of its last refresh
    std::vector<std::vector<int32_t>> revealed_by_; // per owner: keys every flight of its last refresh needs
    uint64_t                version_ = 0;
    bool                    learning_ = true; // see set_learning
    std::vector<std::vector<float>> routers_; // per layer: router weights, for prefetch
    int32_t                 router_n_embd_ = 0;

    ComputeGate             gate_{1};
    EventLog                events_;

    std::unique_ptr<UploadQueue> queue_; // last: its workers stop before the rest goes away
};

} // namespace bevy
