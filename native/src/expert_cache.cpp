#include "expert_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace bevy {

namespace {
constexpr uint64_t kSlotAlign   = 4096;
constexpr uint64_t kTensorAlign = 32; // ggml's TENSOR_ALIGNMENT: where a tensor over the slots may start
}

ExpertCache::ExpertCache(const CacheConfig & cfg, Link * link, std::string & err)
    : cfg_(cfg), link_(link), sources_((size_t) cfg.n_layer * std::max(cfg.n_kinds, 1), 0),
      writers_(sources_.size()), staging_(std::max(cfg.n_workers, 0)),
      dir_(cfg.n_layer, cfg.n_expert, cfg.n_slots, cfg.policy, cfg.seed),
      layer_counters_(cfg.n_layer), used_(cfg.n_expert, 0), load_errors_(cfg.n_slots),
      requested_((size_t) std::max(cfg.n_layer, 0) * std::max(cfg.n_expert, 0), 0) {
    if (cfg.n_layer <= 0 || cfg.n_expert <= 0 || cfg.n_kinds <= 0 || cfg.n_kinds > kMaxKinds || cfg.n_slots <= 0
            || cfg.n_workers <= 0) {
        err = "bad cache parameters (layers, experts, kinds, slots and workers must be positive)";
        return;
    }
    if (!make_classes(err)) {
        return;
    }
    for (const SlotClass & c : classes_) {
        for (int32_t k = 0; k < cfg.n_kinds; ++k) {
            if (cfg.external_slots) { // the caller's (set_slot_data), before any load
                memory_.push_back(nullptr);
                continue;
            }
            const uint64_t bytes = (uint64_t) c.n * c.kind_stride[k];
            void * mem = bytes ? std::aligned_alloc(kSlotAlign, (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign) : nullptr;
            if (!mem) {
                err = "cannot allocate " + std::to_string(bytes) + " bytes of expert cache";
                return;
            }
            // touch every page now: the kernel zeroes fresh pages on first touch, which would
            // otherwise land on the loads (and stall decoding) instead of on start-up
            std::memset(mem, 0, bytes);
            memory_.push_back(mem);
        }
    }
    queue_ = std::make_unique<UploadQueue>(cfg.n_workers,
                                           [this](const LoadJob & job, int32_t worker) { return load(job, worker); });
    ok_    = true;
}

bool ExpertCache::make_classes(std::string & err) {
    const int32_t n = std::max(cfg_.n_classes, 1);
    int64_t first = 0;
    for (int32_t c = 0; c < n; ++c) {
        SlotClass sc;
        sc.first = first;
        sc.n     = cfg_.n_classes > 1 ? cfg_.class_slots[c] : cfg_.n_slots;
        for (int32_t k = 0; k < cfg_.n_kinds; ++k) {
            sc.kind_bytes[k]  = cfg_.n_classes > 1 ? cfg_.class_kind_bytes[c][k] : cfg_.kind_bytes[k];
            sc.kind_stride[k] = cfg_.class_kind_stride[c][k] ? cfg_.class_kind_stride[c][k] : sc.kind_bytes[k];
            sc.bytes += sc.kind_bytes[k];
            const bool packed = sc.kind_stride[k] == sc.kind_bytes[k];
            if (sc.kind_stride[k] < sc.kind_bytes[k] || (!packed && (sc.kind_stride[k] % kSlotAlign || cfg_.external_slots))) {
                err = "slot class " + std::to_string(c) + ": a stride of " + std::to_string(sc.kind_stride[k]) +
                      " bytes for kind " + std::to_string(k) + " (" + std::to_string(sc.kind_bytes[k]) +
                      " bytes) must be the kind's bytes, or whole pages above them in slots of libbevy's own";
                return false;
            }
        }
        if (sc.n <= 0) {
            err = "slot class " + std::to_string(c) + " has no slots";
            return false;
        }
        first += sc.n;
        classes_.push_back(sc);
    }
    if (first != cfg_.n_slots) {
        err = "the slot classes hold " + std::to_string(first) + " slots, n_slots is " + std::to_string(cfg_.n_slots);
        return false;
    }
    layer_class_ = cfg_.layer_class.empty() ? std::vector<int32_t>(cfg_.n_layer, 0) : cfg_.layer_class;
    if ((int32_t) layer_class_.size() != cfg_.n_layer) {
        err = "layer_class has " + std::to_string(layer_class_.size()) + " entries for " + std::to_string(cfg_.n_layer) + " layers";
        return false;
    }
    for (int32_t il = 0; il < cfg_.n_layer; ++il) {
        const int32_t c = layer_class_[il];
        if (c == BEVY_DENSE_LAYER) { // no routed experts (a dense leading layer): no slots, no lookups
            dir_.set_layer_slots(il, 0, 0);
            continue;
        }
        if (c < 0 || c >= n) {
            err = "layer " + std::to_string(il) + " has slot class " + std::to_string(c) + ", outside [0, " + std::to_string(n) + ")";
            return false;
        }
        dir_.set_layer_slots(il, classes_[c].first, classes_[c].first + classes_[c].n);
    }
    return true;
}

// a worker's staging buffer for an expert that a slot writer lays out: the staging allocator's
// memory (pinned host memory for a GPU) where it gives some, else 4 KiB-aligned host memory (both
// fit O_DIRECT reads); grown as needed, freed with the cache
void * ExpertCache::staging_buffer(int32_t worker, uint64_t nbytes) {
    Staging & buf = staging_[worker];
    if (buf.size >= nbytes) {
        return buf.data;
    }
    free_staging(buf);
    const uint64_t size = (nbytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    if (staging_alloc_.alloc) {
        buf.data = staging_alloc_.alloc(staging_alloc_.user, size, &buf.handle);
        staging_custom_ += buf.data != nullptr;
    }
    if (!buf.data) {
        buf.handle = nullptr;
        buf.data   = std::aligned_alloc(kSlotAlign, size);
    }
    buf.size = buf.data ? size : 0;
    return buf.data;
}

void ExpertCache::free_staging(Staging & buf) {
    if (buf.handle) {
        staging_alloc_.free(buf.handle);
    } else {
        std::free(buf.data);
    }
    buf = {};
}

ExpertCache::~ExpertCache() {
    queue_.reset(); // joins the workers before the memory they write goes away
    for (Staging & buf : staging_) {
        free_staging(buf);
    }
    if (!cfg_.external_slots) {
        for (void * mem : memory_) {
            std::free(mem);
        }
    }
}

uint64_t ExpertCache::slot_phase(int32_t il, int32_t kind) const {
    // an expert of whole pages at a file offset inside a page takes its slot at that offset's place
    // in the page, where the stride leaves a page of room for the aligned superset an O_DIRECT
    // read brings (every expert of the tensor then shares the place); else it starts the slot
    const int32_t c = layer_class_[il];
    if (c == BEVY_DENSE_LAYER) {
        return 0;
    }
    const SlotClass & sc = classes_[c];
    const uint64_t nbytes = sc.kind_bytes[kind];
    const uint64_t phase  = sources_[(size_t) il * cfg_.n_kinds + kind] % kSlotAlign;
    if (nbytes % kSlotAlign != 0 || sc.kind_stride[kind] < nbytes + kSlotAlign || phase % kTensorAlign != 0) {
        return 0;
    }
    return phase;
}

bool ExpertCache::load(const LoadJob & queued, int32_t worker) {
    LoadJob job = queued;
    if (job.slot < 0 && !assign_deferred(job)) {
        return false;
    }
    std::string err;
    bool ok = true;
    const int64_t t0 = now_ns();
    const int32_t     c  = layer_class_[job.layer];
    const SlotClass & sc = classes_[c];
    for (int32_t k = 0; k < cfg_.n_kinds && ok; ++k) {
        const uint64_t nbytes = sc.kind_bytes[k];
        const size_t   lk     = (size_t) job.layer * cfg_.n_kinds + k; // (layer, kind)
        const uint64_t offset = sources_[lk] + (uint64_t) job.expert * nbytes;
        const SlotWriter & w = writers_[lk];
        if (!slot_data(c, k) || (cfg_.external_slots && !w.fn)) { // external slots: written only through a writer
            err = "kind " + std::to_string(k) + " of layer " + std::to_string(job.layer) + " has no slot memory or writer";
            ok = false;
            break;
        }
        const uint64_t stride = sc.kind_stride[k];
        const uint64_t phase  = slot_phase(job.layer, k);
        char * dst = static_cast<char *>(slot_data(c, k)) + (uint64_t) (job.slot - sc.first) * stride + phase;
        if (!w.fn) { // the slot's room around the expert takes an O_DIRECT read's aligned superset
            ok = link_->read_padded(offset, nbytes, dst, phase, stride - phase - nbytes, err);
            continue;
        }
        // a page of room on each side in staging: the expert lands at its offset's place in a page
        char * staging = static_cast<char *>(staging_buffer(worker, nbytes + 2 * kSlotAlign));
        const uint64_t at = offset % kSlotAlign;
        ok = staging && link_->read_padded(offset, nbytes, staging + at, at, 2 * kSlotAlign - at, err);
        if (!staging) {
            err = "no memory for a staging buffer of " + std::to_string(nbytes) + " bytes";
        } else if (ok && w.fn(w.type, w.ne0, w.ne1, dst, staging + at, nbytes) != 0) {
            err = "laying out kind " + std::to_string(k) + " in its slot failed";
            ok = false;
        }
    }
    events_.add({kEventLoad, worker, job.layer, job.expert, t0, now_ns()});
    {
        std::lock_guard<std::mutex> lock(mutex_);
        version_++;
        if (ok) {
            dir_.set_state(job.slot, SlotState::Ready);
        } else {
            load_errors_[job.slot] = "loading expert " + std::to_string(job.expert) + " of layer " +
                                     std::to_string(job.layer) + " failed: " + err;
            dir_.clear(job.slot);
        }
    }
    changed_.notify_all();
    return true;
}

int32_t ExpertCache::register_context() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_ids_.empty()) {
        const int32_t id = free_ids_.back();
        free_ids_.pop_back();
        positions_[id] = -1;
        return id;
    }
    positions_.push_back(-1);
    return (int32_t) positions_.size() - 1;
}

void ExpertCache::unregister_context(int32_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (id >= 0 && id < (int32_t) positions_.size()) {
        positions_[id] = -1;
        free_ids_.push_back(id);
    }
}

int32_t ExpertCache::context_entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return (int32_t) positions_.size();
}

void ExpertCache::set_router(int32_t il, const float * w, int32_t n_embd) {
    std::lock_guard<std::mutex> lock(mutex_);
    routers_.resize(cfg_.n_layer);
    routers_[il].assign(w, w + (size_t) cfg_.n_expert * n_embd);
    router_n_embd_ = n_embd;
}

const float * ExpertCache::router(int32_t il, int32_t * n_embd) const {
    // written before any decode, read-only afterwards
    if (il < 0 || il >= (int32_t) routers_.size() || routers_[il].empty()) {
        return nullptr;
    }
    *n_embd = router_n_embd_;
    return routers_[il].data();
}

void ExpertCache::score_prediction(int32_t il, uint64_t hits, uint64_t wasted, uint64_t missed) {
    std::lock_guard<std::mutex> lock(mutex_);
    Counters & lc = layer_counters_[il];
    lc.prefetch_hits += hits;
    lc.prefetch_wasted += wasted;
    lc.prefetch_missed += missed;
}

int32_t ExpertCache::acquire(const AcquireRequest & req, int64_t * slots, std::vector<int64_t> & pins,
                             std::string & err) {
    const int32_t il = req.il;
    const int32_t * experts = req.experts;
    const int32_t n = req.n;
    if (!valid_layer(il, err)) {
        return -1;
    }
    const auto deadline = wait_deadline();

    std::unique_lock<std::mutex> lock(mutex_);
    Counters & lc = layer_counters_[il];
    if (req.context >= 0 && req.context < (int32_t) positions_.size()) {
        positions_[req.context] = il;
    }
    const std::vector<int32_t> single = { il };
    const std::vector<int32_t> & now = positions_.empty() ? single : positions_;
    std::fill(used_.begin(), used_.end(), 0);
    // first pin what is resident, so that loading the rest cannot evict it
    for (int32_t i = 0; i < n; ++i) {
        const int32_t e = experts[i];
        if (e < 0 || e >= cfg_.n_expert) {
            err = "expert id " + std::to_string(e) + " is outside [0, " + std::to_string(cfg_.n_expert) + ")";
            return -1;
        }
        used_[e] = 1;
        slots[i] = dir_.find(il, e);
        if (slots[i] >= 0) {
            lc.hits += req.count;
            dir_.pin(slots[i]);
            if (learning_) {
                dir_.touch(slots[i]);
            }
            pinned_++;
            pins.push_back(slots[i]);
        }
    }
    for (int32_t i = 0; i < n; ++i) {
        if (slots[i] >= 0) {
            continue;
        }
        const int32_t e = experts[i];
        int64_t s;
        bool evicted = false;
        while ((s = dir_.assign(il, e, now, &evicted, upcoming_)) < 0) {
            if (pinned_ <= (int64_t) pins.size() && !dir_.any_loading(il)) { // nothing will free a slot
                err = "the expert cache has " + std::to_string(classes_[layer_class_[il]].n) + " slots for layer " +
                      std::to_string(il) + "'s experts, which needs more than that at once: raise --expert-cache";
                return -1;
            }
            if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
                return timed_out("a free slot", il, err);
            }
        }
        lc.misses += req.count;
        lc.loads++;
        lc.bytes_loaded += expert_bytes(il);
        lc.evictions += evicted ? 1 : 0;
        queue_->push({s, il, e, req.priority});
        dir_.pin(s);
        if (learning_) {
            dir_.touch(s);
        }
        pinned_++;
        pins.push_back(s);
        slots[i] = s;
    }
    if (learning_) {
        dir_.visit(il, used_);
    }

    // prefetch: load predicted experts of the next layer behind every demand load, never waiting
    // for them and never evicting a pinned slot
    const int32_t il_next = il + 1;
    for (int32_t i = 0; i < req.n_prefetch && il_next < cfg_.n_layer; ++i) {
        const int32_t e = req.prefetch[i];
        if (e < 0 || e >= cfg_.n_expert || dir_.find(il_next, e) >= 0) {
            continue;
        }
        bool evicted = false;
        const int64_t s = dir_.assign(il_next, e, now, &evicted, upcoming_);
        if (s < 0) {
            break;
        }
        Counters & nc = layer_counters_[il_next];
        nc.loads++;
        nc.prefetch_loads++;
        nc.bytes_loaded += expert_bytes(il_next);
        nc.evictions += evicted ? 1 : 0;
        queue_->push({s, il_next, e, (1ull << 62) | req.priority});
    }

    if (req.ready) { // two passes: the caller computes what is loaded now and waits for the rest later
        for (int32_t i = 0; i < n; ++i) {
            req.ready[i] = dir_.state(slots[i]) == SlotState::Ready ? 1 : 0;
        }
        return 0;
    }
    return wait_loaded_locked(lock, il, slots, n, deadline, err);
}

bool ExpertCache::valid_layer(int32_t il, std::string & err) const {
    if (il < 0 || il >= cfg_.n_layer) {
        err = "layer " + std::to_string(il) + " is outside the cache's " + std::to_string(cfg_.n_layer) + " layers";
        return false;
    }
    if (layer_class_[il] == BEVY_DENSE_LAYER) {
        err = "layer " + std::to_string(il) + " has no routed experts (a dense layer)";
        return false;
    }
    return true;
}

int32_t ExpertCache::timed_out(const char * what, int32_t il, std::string & err) const {
    err = "timed out after " + std::to_string(cfg_.wait_timeout_ms) + " ms waiting for " + what + " at layer " +
          std::to_string(il);
    return -1;
}

std::chrono::steady_clock::time_point ExpertCache::wait_deadline() const {
    using clock = std::chrono::steady_clock;
    return cfg_.wait_timeout_ms > 0 ? clock::now() + std::chrono::milliseconds(cfg_.wait_timeout_ms)
                                    : clock::time_point::max();
}

void ExpertCache::count_second_pass(int32_t il, int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (il >= 0 && il < cfg_.n_layer) {
        layer_counters_[il].second_pass += (uint64_t) n;
    }
}

int32_t ExpertCache::wait_loaded(int32_t il, const int64_t * slots, int32_t n, std::string & err) {
    if (!valid_layer(il, err)) {
        return -1;
    }
    const auto deadline = wait_deadline();
    std::unique_lock<std::mutex> lock(mutex_);
    return wait_loaded_locked(lock, il, slots, n, deadline, err);
}

int32_t ExpertCache::wait_loaded_locked(std::unique_lock<std::mutex> & lock, int32_t il, const int64_t * slots, int32_t n,
                                        std::chrono::steady_clock::time_point deadline, std::string & err) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    bool waited = false;
    for (int32_t i = 0; i < n; ++i) {
        while (dir_.state(slots[i]) == SlotState::Loading) {
            waited = true;
            if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
                return timed_out("expert loads", il, err);
            }
        }
        if (dir_.state(slots[i]) != SlotState::Ready) {
            err = load_errors_[slots[i]];
            return -1;
        }
    }
    if (waited) {
        layer_counters_[il].stall_ns +=
            (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
    }
    return 0;
}

void ExpertCache::release(std::vector<int64_t> & pins) {
    if (pins.empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (int64_t s : pins) {
            dir_.unpin(s);
        }
        pinned_ -= (int64_t) pins.size();
    }
    pins.clear();
    changed_.notify_all();
}

int32_t ExpertCache::query_locked(int32_t il, const int32_t * experts, int32_t n, uint64_t priority, bool load,
                                  bool count, int32_t owner) {
    if (il < 0 || il >= cfg_.n_layer) {
        return -1;
    }
    Counters & lc = layer_counters_[il];
    int32_t absent = 0;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t e = experts[i];
        if (e < 0 || e >= cfg_.n_expert) {
            return -1;
        }
        int64_t s = dir_.find(il, e);
        if (s >= 0) {
            lc.hits += count;
            absent += dir_.state(s) != SlotState::Ready;
            continue;
        }
        absent++;
        const size_t k = (size_t) il * cfg_.n_expert + e;
        if (requested_[k]) { // queued already: in flight
            lc.hits += count;
            continue;
        }
        lc.misses += count;
        if (load) {
            requested_[k] = 1; // a slot is chosen when a link worker takes the job (assign_deferred)
            queue_->push({-1, il, e, priority, owner});
        }
    }
    return absent;
}

bool ExpertCache::assign_deferred(LoadJob & job) {
    std::unique_lock<std::mutex> lock(mutex_);
    requested_[(size_t) job.layer * cfg_.n_expert + job.expert] = 0;
    if (dir_.find(job.layer, job.expert) >= 0) {
        return false; // a hook needed it first and loaded it
    }
    bool evicted = false;
    const int64_t s = dir_.assign(job.layer, job.expert, positions_, &evicted, upcoming_);
    if (s < 0) {
        // every slot is pinned or loading: wake the scheduler, which asks again at its next refresh
        version_++;
        lock.unlock();
        changed_.notify_all();
        return false;
    }
    Counters & lc = layer_counters_[job.layer];
    lc.loads++;
    lc.bytes_loaded += expert_bytes(job.layer);
    lc.evictions += evicted ? 1 : 0;
    const int32_t key = job.layer * cfg_.n_expert + job.expert;
    if (job.owner >= 0 && (size_t) job.owner < reserved_.size() && holding_[job.owner] &&
            std::binary_search(wanted_[job.owner].begin(), wanted_[job.owner].end(), key)) {
        dir_.pin(s); // until the owner's next refresh, which keeps it only if a flight still wants it
        pinned_++;
        reserved_[job.owner].push_back(s);
    }
    job.slot = s;
    return true;
}

int32_t ExpertCache::refresh(int32_t owner, bevy_flight * flights, int32_t n, bevy_pass * pass) {
    if (owner < 0 || owner >= kMaxOwners || n < 0) {
        return -1;
    }
    for (int32_t i = 0; i < n; ++i) { // validate first: a bad id changes nothing
        const bevy_flight & f = flights[i];
        if (f.layer < 0 || f.layer >= cfg_.n_layer || f.n_experts < 0 || (f.n_experts > 0 && !f.experts)) {
            return -1;
        }
        for (int32_t j = 0; j < f.n_experts; ++j) {
            if (f.experts[j] < 0 || f.experts[j] >= cfg_.n_expert) {
                return -1;
            }
        }
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (pass) {
            pass->version = version_;
        }
        if ((size_t) owner >= reserved_.size()) {
            reserved_.resize(owner + 1);
            holding_.resize(owner + 1);
            wanted_.resize(owner + 1);
            upcoming_by_.resize(owner + 1);
            revealed_by_.resize(owner + 1);
        }
        holding_[owner] = 1;
        std::vector<int32_t> & upcoming = upcoming_by_[owner];
        upcoming.clear();
        for (int32_t i = 0; i < n; ++i) {
            upcoming.push_back(flights[i].layer);
        }
        upcoming_.clear();
        for (const auto & u : upcoming_by_) {
            upcoming_.insert(upcoming_.end(), u.begin(), u.end());
        }
        std::vector<int32_t> & revealed = revealed_by_[owner]; // every flight's, admitted or not
        std::vector<int32_t> & wanted = wanted_[owner];         // the admitted flights'
        forget_revealed_locked(owner);
        wanted.clear();
        for (int32_t i = 0; i < n; ++i) {
            for (int32_t j = 0; j < flights[i].n_experts; ++j) {
                const int32_t key = flights[i].layer * cfg_.n_expert + flights[i].experts[j];
                dir_.reveal(flights[i].layer, flights[i].experts[j], +1);
                revealed.push_back(key);
                if (flights[i].admit) {
                    wanted.push_back(key);
                }
            }
        }
        std::sort(wanted.begin(), wanted.end());
        std::vector<int64_t> & reserved = reserved_[owner];
        for (int64_t s : reserved) {
            dir_.unpin(s);
        }
        pinned_ -= (int64_t) reserved.size();
        reserved.clear();
        // hold what the admitted flights have, then load what they lack (never evicting the held)
        for (int32_t i = 0; i < n; ++i) {
            for (int32_t j = 0; flights[i].admit && j < flights[i].n_experts; ++j) {
                const int64_t s = dir_.find(flights[i].layer, flights[i].experts[j]);
                if (s >= 0) {
                    dir_.pin(s);
                    pinned_++;
                    reserved.push_back(s);
                }
            }
        }
        for (int32_t i = 0; i < n; ++i) {
            const bevy_flight & f = flights[i];
            if (f.admit) {
                query_locked(f.layer, f.experts, f.n_experts, f.priority, true, f.count != 0, owner);
            }
        }
        for (int32_t i = 0; i < n; ++i) { // after every load started: who still lacks experts, and until when
            bevy_flight & f = flights[i];
            f.absent = query_locked(f.layer, f.experts, f.n_experts, 0, false, f.count != 0 && !f.admit);
            f.eta_ns = f.absent == 0 ? 0 : f.admit ? queue_->eta_ns(f.priority) : -1;
        }
        if (pass) {
            for (int32_t il = 0; il < pass->n_layer && il < cfg_.n_layer; ++il) {
                pass->hits[il]   = layer_counters_[il].hits;
                pass->misses[il] = layer_counters_[il].misses;
            }
            pass->load_ns = queue_->job_ns();
        }
    }
    changed_.notify_all(); // dropped reservations may free slots a waiter needs
    return 0;
}

void ExpertCache::lookups(uint64_t * hits, uint64_t * misses, int32_t n_layer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int32_t il = 0; il < n_layer && il < cfg_.n_layer; ++il) {
        hits[il]   = layer_counters_[il].hits;
        misses[il] = layer_counters_[il].misses;
    }
}

uint64_t ExpertCache::version() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return version_;
}

bool ExpertCache::wait_change(uint64_t since, int32_t timeout_ms, int32_t il) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    const bool changed = changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return version_ != since; });
    if (il >= 0 && il < cfg_.n_layer) {
        layer_counters_[il].stall_ns +=
            (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count();
    }
    return changed;
}

void ExpertCache::forget_revealed_locked(int32_t owner) {
    for (int32_t k : revealed_by_[owner]) {
        dir_.reveal(k / cfg_.n_expert, k % cfg_.n_expert, -1);
    }
    revealed_by_[owner].clear();
}

void ExpertCache::unreserve_all(int32_t owner) {
    std::vector<int64_t> pins;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (owner < 0 || (size_t) owner >= reserved_.size()) {
            return;
        }
        pins.swap(reserved_[owner]);
        forget_revealed_locked(owner);
        holding_[owner] = 0; // its loads chosen from now on are not held for it (it computes without reservations)
    }
    release(pins);
}

Counters ExpertCache::counters(int32_t il) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (il >= 0) {
        return il < cfg_.n_layer ? layer_counters_[il] : Counters{};
    }
    Counters total{};
    for (const auto & c : layer_counters_) {
#define BEVY_ADD_COUNTER(name, what) total.name += c.name;
        BEVY_COUNTERS(BEVY_ADD_COUNTER)
#undef BEVY_ADD_COUNTER
    }
    return total;
}

} // namespace bevy
