// C API: the expert cache, its scheduling calls, the compute gate and events (include/bevy.h).
#include "capi_common.hpp"

#include <algorithm>

using bevy::capi::guarded;
using bevy::capi::last_error;

bevy_cache_params bevy_cache_default_params(void) {
    bevy_cache_params p = {};
    p.policy          = BEVY_POLICY_NEXT_USE;
    p.n_workers       = 2;
    p.wait_timeout_ms = 0;
    return p;
}

bevy_cache * bevy_cache_new(const bevy_cache_params * params, bevy_link * link) {
    if (!params || !link) {
        last_error() = "bevy_cache_new needs parameters and a link";
        return nullptr;
    }
    if (params->policy < BEVY_POLICY_LRU || params->policy > BEVY_POLICY_RANDOM) {
        last_error() = "unknown eviction policy " + std::to_string(params->policy);
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
        if (params->n_classes < 0 || params->n_classes > BEVY_MAX_CLASSES) {
            last_error() = "bevy_cache_new: n_classes " + std::to_string(params->n_classes) + " is outside [0, " +
                           std::to_string(BEVY_MAX_CLASSES) + "]";
            return nullptr;
        }
        cfg.n_classes = params->n_classes;
        for (int32_t c = 0; c < params->n_classes; ++c) {
            cfg.class_slots[c] = params->class_slots[c];
            for (int32_t k = 0; k < BEVY_MAX_KINDS; ++k) {
                cfg.class_kind_bytes[c][k] = params->class_kind_bytes[c][k];
            }
        }
        for (int32_t c = 0; c < std::max(params->n_classes, 1); ++c) {
            for (int32_t k = 0; k < BEVY_MAX_KINDS; ++k) {
                cfg.class_kind_stride[c][k] = params->class_kind_stride[c][k];
            }
        }
        cfg.external_slots = params->external_slots != 0;
        if (params->layer_class && params->n_layer > 0) {
            cfg.layer_class.assign(params->layer_class, params->layer_class + params->n_layer);
        }
        std::string err;
        auto cache = std::make_unique<bevy::ExpertCache>(cfg, link->link.get(), err);
        if (!cache->ok()) {
            last_error() = err;
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
        last_error() = "bevy_cache_set_source: layer or kind out of range";
        return -1;
    }
    cache->cache->set_source(il, kind, offset);
    return 0;
}

int32_t bevy_cache_set_writer(bevy_cache * cache, int32_t il, int32_t kind, bevy_slot_writer_fn fn,
                              int32_t type, int64_t ne0, int64_t ne1) {
    const auto & cfg = cache->cache->config();
    if (il < 0 || il >= cfg.n_layer || kind < 0 || kind >= cfg.n_kinds) {
        last_error() = "bevy_cache_set_writer: layer or kind out of range";
        return -1;
    }
    cache->cache->set_writer(il, kind, {fn, type, ne0, ne1});
    return 0;
}

int64_t bevy_cache_slot_phase(const bevy_cache * cache, int32_t il, int32_t kind) {
    if (!cache || il < 0 || il >= cache->cache->config().n_layer || kind < 0 || kind >= cache->cache->config().n_kinds) {
        last_error() = "bevy_cache_slot_phase: layer or kind out of range";
        return -1;
    }
    return (int64_t) cache->cache->slot_phase(il, kind);
}

void * bevy_cache_class_data(bevy_cache * cache, int32_t c, int32_t kind) {
    if (c < 0 || c >= cache->cache->n_classes() || kind < 0 || kind >= cache->cache->config().n_kinds) {
        last_error() = "bevy_cache_class_data: class or kind out of range";
        return nullptr;
    }
    void * data = cache->cache->slot_data(c, kind);
    if (!data) {
        last_error() = "bevy_cache_class_data: external slots of class " + std::to_string(c) + " not given yet";
    }
    return data;
}

int32_t bevy_cache_set_staging(bevy_cache * cache, bevy_staging_alloc_fn alloc, bevy_staging_free_fn free, void * user) {
    if ((alloc == nullptr) != (free == nullptr)) {
        last_error() = "bevy_cache_set_staging: give both alloc and free, or neither";
        return -1;
    }
    cache->cache->set_staging({alloc, free, user});
    return 0;
}

int64_t bevy_cache_staging_given(const bevy_cache * cache) {
    return cache->cache->staging_custom();
}

int32_t bevy_cache_set_class_data(bevy_cache * cache, int32_t c, int32_t kind, void * data) {
    if (!cache->cache->config().external_slots) {
        last_error() = "bevy_cache_set_class_data: this cache allocates its own slots (external_slots 0)";
        return -1;
    }
    if (c < 0 || c >= cache->cache->n_classes() || kind < 0 || kind >= cache->cache->config().n_kinds || !data) {
        last_error() = "bevy_cache_set_class_data: class or kind out of range, or no memory given";
        return -1;
    }
    cache->cache->set_slot_data(c, kind, data);
    return 0;
}

int32_t bevy_cache_counters(const bevy_cache * cache, int32_t il, bevy_counters * out) {
    if (il < -1 || il >= cache->cache->config().n_layer) {
        last_error() = "bevy_cache_counters: layer " + std::to_string(il) + " out of range";
        return -1;
    }
    *out = cache->cache->counters(il);
    if (il < 0) {
        out->compute_busy_ns = cache->cache->gate().busy_ns();
        out->compute_used_ns = cache->cache->gate().used_ns();
        out->link_busy_ns    = cache->cache->link_busy_ns();
    }
    return 0;
}

int64_t bevy_cache_pinned(const bevy_cache * cache) {
    return cache->cache->pinned();
}

void bevy_cache_set_learning(bevy_cache * cache, bool on) {
    cache->cache->set_learning(on);
}

int32_t bevy_cache_context_entries(const bevy_cache * cache) {
    return cache->cache->context_entries();
}

int32_t bevy_cache_set_concurrency(bevy_cache * cache, int32_t n) {
    if (n <= 0) {
        last_error() = "concurrency must be positive";
        return -1;
    }
    cache->cache->gate().set_capacity(n);
    return 0;
}

int32_t bevy_cache_refresh(bevy_cache * cache, int32_t owner, bevy_flight * flights, int32_t n, bevy_pass * pass) {
    const int32_t r = cache->cache->refresh(owner, flights, n, pass);
    if (r < 0) {
        last_error() = "bevy_cache_refresh: owner, layer or expert out of range";
    }
    return r;
}

void bevy_cache_lookups(const bevy_cache * cache, uint64_t * hits, uint64_t * misses, int32_t n_layer) {
    cache->cache->lookups(hits, misses, n_layer);
}

uint64_t bevy_cache_version(const bevy_cache * cache) {
    return cache->cache->version();
}

int64_t bevy_cache_load_ns(const bevy_cache * cache) {
    return cache->cache->load_ns();
}

uint64_t bevy_cache_wait(bevy_cache * cache, uint64_t since, int32_t timeout_ms, int32_t il) {
    cache->cache->wait_change(since, timeout_ms, il);
    return cache->cache->version();
}

void bevy_cache_unreserve_all(bevy_cache * cache, int32_t owner) {
    cache->cache->unreserve_all(owner);
}

void bevy_cache_trace(bevy_cache * cache, int64_t max_events) {
    cache->cache->events().enable(max_events);
}

int64_t bevy_cache_events(bevy_cache * cache, bevy_event * out, int64_t max) {
    return cache->cache->events().drain(out, max);
}

int64_t bevy_now_ns(void) {
    return bevy::now_ns();
}

int32_t bevy_cache_set_router(bevy_cache * cache, int32_t il, const float * weights, int32_t n_embd) {
    const auto & cfg = cache->cache->config();
    if (il < 0 || il >= cfg.n_layer || !weights || n_embd <= 0) {
        last_error() = "bevy_cache_set_router: bad layer, weights or width";
        return -1;
    }
    return guarded([&]() -> int32_t {
        cache->cache->set_router(il, weights, n_embd);
        return 0;
    }, -1);
}
