// The C API of libbevy (include/bevy.h): handles around the C++ core; no exception crosses it.
#include "bevy.h"

#include "compute_gate.hpp"
#include "expert_cache.hpp"
#include "links.hpp"
#include "slot_directory.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

struct bevy_link {
    std::unique_ptr<bevy::Link> link;
};

struct bevy_cache {
    std::unique_ptr<bevy::ExpertCache> cache;
};

struct bevy_hook {
    bevy::ExpertCache *  cache;
    int32_t              id;              // registration in the cache (its position steers eviction)
    std::vector<int64_t> pins;            // slots of the layer the context computes now
    std::vector<int32_t> distinct;        // scratch: distinct experts of a call
    std::vector<int64_t> slots;           // scratch: their slots
    std::vector<int64_t> slot_of;         // scratch: expert -> slot for this call
    std::string          error;

    bevy::ComputeGate *  gate    = nullptr; // the cache's gate when this context is gated
    bool                 holding = false;
    int64_t              token   = 0;       // the token this context decodes (its progress)
    int32_t              computing = -1;    // the layer it computes since computing_since (-1: none)
    int64_t              computing_since = 0;

    bool                 counting = true;   // count hits and misses (a scheduler may count them itself)
    int32_t              count_from = 0;    // ... only at layers from this one on
    std::vector<int32_t> routed;            // ids of the last route-only call, token-major
    int32_t              routed_il = -1;
    int32_t              routed_k  = 0;

    bool                 prefetch = false;  // predict layer il + 1 from layer il's router input
    std::vector<int32_t> predicted;         // experts predicted for predicted_il
    int32_t              predicted_il = -1;
    std::vector<float>   scores;            // scratch: router logits
    std::vector<uint8_t> mark;              // scratch: expert flags

    void leave_gate() {
        if (holding) {
            gate->leave();
            holding = false;
        }
    }

    // the layer computed since the last hook is done
    void end_compute(int64_t now) {
        if (computing >= 0) {
            cache->events().add({bevy::kEventCompute, id, computing, -1, computing_since, now});
            computing = -1;
        }
    }
};

namespace {

thread_local std::string g_error;

template <typename F>
auto guarded(F && f, decltype(f()) on_error) noexcept -> decltype(f()) {
    try {
        return f();
    } catch (const std::bad_alloc &) {
        g_error = "out of memory";
    } catch (const std::exception & e) {
        g_error = e.what();
    } catch (...) {
        g_error = "unknown error";
    }
    return on_error;
}

bevy_link * wrap(std::unique_ptr<bevy::Link> link, const std::string & err) {
    if (!link) {
        g_error = err;
        return nullptr;
    }
    return new bevy_link{std::move(link)};
}

} // namespace

const char * bevy_last_error(void) {
    return g_error.c_str();
}

bevy_link * bevy_link_file_new(const char * path) {
    return guarded([&]() -> bevy_link * {
        std::string err;
        return wrap(bevy::make_file_link(path, err), err);
    }, nullptr);
}

bevy_link * bevy_link_ram_new(const char * path, const uint64_t * offsets, const uint64_t * sizes, int32_t n) {
    return guarded([&]() -> bevy_link * {
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        for (int32_t i = 0; i < n; ++i) {
            ranges.emplace_back(offsets[i], sizes[i]);
        }
        std::string err;
        return wrap(bevy::make_ram_link(path, ranges, err), err);
    }, nullptr);
}

bevy_link * bevy_link_throttle_new(bevy_link * inner, double bytes_per_s) {
    if (!inner || !(bytes_per_s > 0)) {
        g_error = "a throttle needs a link and a positive rate";
        return nullptr;
    }
    return guarded([&]() -> bevy_link * {
        auto link = bevy::make_throttle_link(std::move(inner->link), bytes_per_s);
        delete inner;
        return new bevy_link{std::move(link)};
    }, nullptr);
}

void bevy_link_free(bevy_link * link) {
    delete link;
}

int32_t bevy_link_describe(const bevy_link * link, char * buf, int32_t size) {
    const std::string d = link->link->describe();
    if (buf && size > 0) {
        std::snprintf(buf, (size_t) size, "%s", d.c_str());
    }
    return (int32_t) d.size();
}

int32_t bevy_link_read(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst) {
    return guarded([&]() -> int32_t {
        std::string err;
        if (!link->link->read(offset, nbytes, dst, err)) {
            g_error = err;
            return -1;
        }
        return 0;
    }, -1);
}

int32_t bevy_link_emulated(const bevy_link * link) {
    return link->link->emulated() ? 1 : 0;
}

uint64_t bevy_link_bounced(const bevy_link * link) {
    return link->link->bounced();
}

bevy_cache_params bevy_cache_default_params(void) {
    bevy_cache_params p = {};
    p.policy          = BEVY_POLICY_NEXT_USE;
    p.n_workers       = 2;
    p.wait_timeout_ms = 0;
    return p;
}

bevy_cache * bevy_cache_new(const bevy_cache_params * params, bevy_link * link) {
    if (!params || !link) {
        g_error = "bevy_cache_new needs parameters and a link";
        return nullptr;
    }
    if (params->policy < 0 || params->policy > BEVY_POLICY_RANDOM) {
        g_error = "unknown eviction policy " + std::to_string(params->policy);
        return nullptr;
    }
    return guarded([&]() -> bevy_cache * {
        bevy::CacheConfig cfg;
        cfg.n_layer         = params->n_layer;
        cfg.n_expert        = params->n_expert;
        cfg.n_kinds         = params->n_kinds;
        cfg.n_slots         = params->n_slots;
        cfg.policy          = static_cast<bevy::Policy>(params->policy);
        cfg.n_workers       = params->n_workers;
        cfg.wait_timeout_ms = params->wait_timeout_ms;
        cfg.seed            = params->seed;
        for (int32_t k = 0; k < BEVY_MAX_KINDS; ++k) {
            cfg.kind_bytes[k] = params->kind_bytes[k];
        }
        std::string err;
        auto cache = std::make_unique<bevy::ExpertCache>(cfg, link->link.get(), err);
        if (!cache->ok()) {
            g_error = err;
            return nullptr;
        }
        return new bevy_cache{std::move(cache)};
    }, nullptr);
}

void bevy_cache_free(bevy_cache * cache) {
    delete cache;
}

int32_t bevy_cache_set_source(bevy_cache * cache, int32_t il, int32_t kind, uint64_t offset) {
    const auto & cfg = cache->cache->config();
    if (il < 0 || il >= cfg.n_layer || kind < 0 || kind >= cfg.n_kinds) {
        g_error = "bevy_cache_set_source: layer or kind out of range";
        return -1;
    }
    cache->cache->set_source(il, kind, offset);
    return 0;
}

void * bevy_cache_slot_data(bevy_cache * cache, int32_t kind) {
    if (kind < 0 || kind >= cache->cache->config().n_kinds) {
        g_error = "bevy_cache_slot_data: kind out of range";
        return nullptr;
    }
    return cache->cache->slot_data(kind);
}

int32_t bevy_cache_counters(const bevy_cache * cache, int32_t il, bevy_counters * out) {
    const bevy::Counters c = cache->cache->counters(il);
    out->hits         = c.hits;
    out->misses       = c.misses;
    out->loads        = c.loads;
    out->bytes_loaded = c.bytes_loaded;
    out->evictions    = c.evictions;
    out->stall_ns     = c.stall_ns;
    out->prefetch_loads  = c.prefetch_loads;
    out->prefetch_hits   = c.prefetch_hits;
    out->prefetch_wasted = c.prefetch_wasted;
    out->prefetch_missed = c.prefetch_missed;
    out->compute_busy_ns = il < 0 ? cache->cache->gate().busy_ns() : 0;
    out->link_busy_ns = il < 0 ? cache->cache->link_busy_ns() : 0;
    return 0;
}

int64_t bevy_cache_pinned(const bevy_cache * cache) {
    return cache->cache->pinned();
}

bevy_hook * bevy_hook_new(bevy_cache * cache) {
    if (!cache) {
        g_error = "bevy_hook_new needs a cache";
        return nullptr;
    }
    return guarded([&]() -> bevy_hook * {
        auto * hook  = new bevy_hook{};
        hook->cache  = cache->cache.get();
        hook->id     = hook->cache->register_context();
        hook->slot_of.assign(cache->cache->config().n_expert, -1);
        hook->mark.assign(cache->cache->config().n_expert, 0);
        return hook;
    }, nullptr);
}

void bevy_hook_free(bevy_hook * hook) {
    if (hook) {
        hook->leave_gate();
        hook->cache->release(hook->pins);
        hook->cache->unregister_context(hook->id);
        delete hook;
    }
}

const char * bevy_hook_last_error(const bevy_hook * hook) {
    return hook->error.c_str();
}

namespace {

// experts of layer il + 1 predicted by its router applied to layer il's router input
void predict_next(bevy_hook * hook, const bevy_moe_call * call) {
    hook->predicted.clear();
    hook->predicted_il = -1;
    int32_t n_embd = 0;
    const float * w = hook->cache->router(call->il + 1, &n_embd);
    if (!w || !call->router_in || call->n_embd != n_embd) {
        return;
    }
    const int32_t n_expert = (int32_t) hook->mark.size();
    const int32_t k        = std::min(call->n_expert_used, n_expert);
    hook->scores.resize(n_expert);
    std::vector<int32_t> order(n_expert);
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        const float * x = call->router_in + t * call->router_in_stride;
        for (int32_t e = 0; e < n_expert; ++e) {
            const float * row = w + (size_t) e * n_embd;
            float acc = 0.0f;
            for (int32_t d = 0; d < n_embd; ++d) {
                acc += row[d] * x[d];
            }
            hook->scores[e] = acc;
        }
        for (int32_t e = 0; e < n_expert; ++e) {
            order[e] = e;
        }
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return hook->scores[a] > hook->scores[b]; });
        for (int32_t j = 0; j < k; ++j) {
            if (!hook->mark[order[j]]) {
                hook->mark[order[j]] = 1;
                hook->predicted.push_back(order[j]);
            }
        }
    }
    for (int32_t e : hook->predicted) {
        hook->mark[e] = 0;
    }
    hook->predicted_il = call->il + 1;
}

// how the prediction for this layer compares with what it selected
void score_prediction(bevy_hook * hook, int32_t il) {
    if (hook->predicted_il != il) {
        return;
    }
    for (int32_t e : hook->distinct) {
        hook->mark[e] = 1;
    }
    uint64_t hits = 0;
    for (int32_t e : hook->predicted) {
        hits += hook->mark[e];
    }
    for (int32_t e : hook->distinct) {
        hook->mark[e] = 0;
    }
    hook->cache->score_prediction(il, hits, hook->predicted.size() - hits, hook->distinct.size() - hits);
}

} // namespace

int32_t bevy_hook_fn(void * user_data, const bevy_moe_call * call) {
    auto * hook = static_cast<bevy_hook *>(user_data);
    return guarded([&]() -> int32_t {
        const int64_t t_enter = bevy::now_ns();
        hook->cache->release(hook->pins); // the previous layer's matmuls are done
        hook->leave_gate();               // and this context may have to wait now
        hook->end_compute(t_enter);
        if (call->il < 0) {
            return 0; // graph done
        }
        const int32_t n_expert = (int32_t) hook->slot_of.size();
        if (call->n_expert != n_expert) {
            hook->error = "layer " + std::to_string(call->il) + " has " + std::to_string(call->n_expert) +
                          " experts, the cache " + std::to_string(n_expert);
            return -1;
        }
        if (call->route_only) {
            // a layer-range lookahead: remember the selection, load nothing, compute nothing
            const int32_t k = call->n_expert_used;
            hook->routed.resize((size_t) call->n_tokens * k);
            for (int32_t t = 0; t < call->n_tokens; ++t) {
                for (int32_t j = 0; j < k; ++j) {
                    hook->routed[(size_t) t * k + j] = call->ids[t * call->ids_stride + j];
                    call->out[t * k + j]             = 0;
                }
            }
            hook->routed_il = call->il;
            hook->routed_k  = k;
            return 0;
        }
        hook->distinct.clear();
        for (int32_t t = 0; t < call->n_tokens; ++t) {
            for (int32_t j = 0; j < call->n_expert_used; ++j) {
                const int32_t e = call->ids[t * call->ids_stride + j];
                if (e < 0 || e >= n_expert) {
                    hook->error = "selected expert " + std::to_string(e) + " is out of range";
                    return -1;
                }
                if (hook->slot_of[e] == -1) {
                    hook->slot_of[e] = -2; // seen
                    hook->distinct.push_back(e);
                }
            }
        }
        if (hook->prefetch) {
            score_prediction(hook, call->il);
            predict_next(hook, call);
        }
        bevy::AcquireRequest req;
        req.il         = call->il;
        req.experts    = hook->distinct.data();
        req.n          = (int32_t) hook->distinct.size();
        req.priority   = bevy::gate_key(hook->token, call->il, hook->id);
        req.context    = hook->id;
        req.prefetch   = hook->predicted_il == call->il + 1 ? hook->predicted.data() : nullptr;
        req.n_prefetch = hook->predicted_il == call->il + 1 ? (int32_t) hook->predicted.size() : 0;
        req.count      = hook->counting && call->il >= hook->count_from;
        hook->slots.resize(hook->distinct.size());
        const int32_t rc = hook->cache->acquire(req, hook->slots.data(), hook->pins, hook->error);
        for (size_t i = 0; i < hook->distinct.size(); ++i) {
            hook->slot_of[hook->distinct[i]] = rc == 0 ? hook->slots[i] : -1;
        }
        if (rc == 0) {
            for (int32_t t = 0; t < call->n_tokens; ++t) {
                for (int32_t j = 0; j < call->n_expert_used; ++j) {
                    const int32_t e = call->ids[t * call->ids_stride + j];
                    call->out[t * call->n_expert_used + j] = (int32_t) hook->slot_of[e];
                }
            }
        }
        for (int32_t e : hook->distinct) {
            hook->slot_of[e] = -1;
        }
        if (rc == 0 && hook->gate) {
            hook->gate->enter(bevy::gate_key(hook->token, call->il, hook->id));
            hook->holding = true;
        }
        const int64_t t_start = bevy::now_ns();
        hook->cache->events().add({bevy::kEventWait, hook->id, call->il, -1, t_enter, t_start});
        if (rc == 0) {
            hook->computing       = call->il;
            hook->computing_since = t_start;
        }
        return rc;
    }, -1);
}

int32_t bevy_cache_refresh(bevy_cache * cache, int32_t owner, int32_t n, const int32_t * layers, const int64_t * offsets,
                           const int32_t * experts, const uint8_t * admit, const uint64_t * priority,
                           const uint8_t * count, int32_t * absent) {
    const int32_t r = cache->cache->refresh(owner, n, layers, offsets, experts, admit, priority, count, absent);
    if (r < 0) {
        g_error = "bevy_cache_refresh: owner, layer or expert out of range";
    }
    return r;
}

void bevy_cache_lookups(const bevy_cache * cache, uint64_t * hits, uint64_t * misses, int32_t n_layer) {
    cache->cache->lookups(hits, misses, n_layer);
}

uint64_t bevy_cache_version(const bevy_cache * cache) {
    return cache->cache->version();
}

int32_t bevy_cache_wait(bevy_cache * cache, uint64_t since, int32_t timeout_ms, int32_t il) {
    return cache->cache->wait_change(since, timeout_ms, il) ? 0 : 1;
}

void bevy_cache_unreserve_all(bevy_cache * cache, int32_t owner) {
    cache->cache->unreserve_all(owner);
}

int32_t bevy_hook_set_counting(bevy_hook * hook, int32_t on, int32_t from_layer) {
    hook->counting   = on != 0;
    hook->count_from = from_layer;
    return 0;
}

int64_t bevy_hook_routed(const bevy_hook * hook, int32_t * out, int64_t max_rows, int32_t * il) {
    if (il) {
        *il = hook->routed_il;
    }
    if (hook->routed_k == 0) {
        return 0;
    }
    const int64_t rows = std::min<int64_t>(max_rows, (int64_t) hook->routed.size() / hook->routed_k);
    std::memcpy(out, hook->routed.data(), (size_t) rows * hook->routed_k * sizeof(int32_t));
    return rows;
}

int32_t bevy_cache_set_concurrency(bevy_cache * cache, int32_t n) {
    if (n <= 0) {
        g_error = "concurrency must be positive";
        return -1;
    }
    cache->cache->gate().set_capacity(n);
    return 0;
}

int32_t bevy_hook_set_gated(bevy_hook * hook, int32_t gated) {
    hook->leave_gate();
    hook->gate = gated ? &hook->cache->gate() : nullptr;
    return 0;
}

void bevy_hook_begin(bevy_hook * hook, int64_t token) {
    hook->token = token;
    if (hook->gate && !hook->holding) {
        hook->gate->enter(bevy::gate_key(token, -1, hook->id));
        hook->holding = true;
    }
}

void bevy_hook_end(bevy_hook * hook) {
    hook->leave_gate();
    hook->end_compute(bevy::now_ns());
}

void bevy_cache_trace(bevy_cache * cache, int64_t max_events) {
    cache->cache->events().enable(max_events);
}

int64_t bevy_cache_events(bevy_cache * cache, bevy_event * out, int64_t max) {
    static_assert(sizeof(bevy_event) == sizeof(bevy::Event), "bevy_event layout");
    return cache->cache->events().drain(reinterpret_cast<bevy::Event *>(out), max);
}

int64_t bevy_now_ns(void) {
    return bevy::now_ns();
}

int32_t bevy_hook_set_prefetch(bevy_hook * hook, int32_t enable) {
    hook->prefetch = enable != 0;
    hook->predicted.clear();
    hook->predicted_il = -1;
    return 0;
}

int32_t bevy_cache_set_router(bevy_cache * cache, int32_t il, const float * weights, int32_t n_embd) {
    const auto & cfg = cache->cache->config();
    if (il < 0 || il >= cfg.n_layer || !weights || n_embd <= 0) {
        g_error = "bevy_cache_set_router: bad layer, weights or width";
        return -1;
    }
    return guarded([&]() -> int32_t {
        cache->cache->set_router(il, weights, n_embd);
        return 0;
    }, -1);
}

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
                    g_error = "a step needs more experts than the cache has slots";
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
