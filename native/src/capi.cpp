// The C API of libbevy (include/bevy.h): handles around the C++ core; no exception crosses it.
#include "bevy.h"

#include "expert_cache.hpp"
#include "links.hpp"
#include "slot_directory.hpp"

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
    std::vector<int64_t> pins;      // slots of the layer the context computes now
    std::vector<int32_t> distinct;  // scratch: distinct experts of a call
    std::vector<int64_t> slots;     // scratch: their slots
    std::vector<int64_t> slot_of;   // scratch: expert -> slot for this call
    std::string          error;
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

bevy_cache_params bevy_cache_default_params(void) {
    bevy_cache_params p = {};
    p.policy          = BEVY_POLICY_NEXT_USE;
    p.n_workers       = 1;
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
    out->link_busy_ns = il < 0 ? cache->cache->link_busy_ns() : 0;
    return 0;
}

void bevy_cache_reset_counters(bevy_cache * cache) {
    cache->cache->reset_counters();
}

bevy_hook * bevy_hook_new(bevy_cache * cache) {
    if (!cache) {
        g_error = "bevy_hook_new needs a cache";
        return nullptr;
    }
    return guarded([&]() -> bevy_hook * {
        auto * hook  = new bevy_hook{};
        hook->cache  = cache->cache.get();
        hook->slot_of.assign(cache->cache->config().n_expert, -1);
        return hook;
    }, nullptr);
}

void bevy_hook_free(bevy_hook * hook) {
    if (hook) {
        hook->cache->release(hook->pins);
        delete hook;
    }
}

const char * bevy_hook_last_error(const bevy_hook * hook) {
    return hook->error.c_str();
}

int32_t bevy_hook_fn(void * user_data, const bevy_moe_call * call) {
    auto * hook = static_cast<bevy_hook *>(user_data);
    return guarded([&]() -> int32_t {
        hook->cache->release(hook->pins); // the previous layer's matmuls are done
        if (call->il < 0) {
            return 0; // graph done
        }
        const int32_t n_expert = (int32_t) hook->slot_of.size();
        if (call->n_expert != n_expert) {
            hook->error = "layer " + std::to_string(call->il) + " has " + std::to_string(call->n_expert) +
                          " experts, the cache " + std::to_string(n_expert);
            return -1;
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
        hook->slots.resize(hook->distinct.size());
        const int32_t rc = hook->cache->acquire(call->il, hook->distinct.data(), (int32_t) hook->distinct.size(),
                                                hook->slots.data(), hook->pins, hook->error);
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
        return rc;
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
                const int64_t s = dir.assign(il, experts[j], il, &evicted);
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
