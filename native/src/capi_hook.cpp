// C API: the cache hook of one llama context (include/bevy.h); the body is CacheHook's.
#include "capi_common.hpp"

using bevy::capi::guarded;
using bevy::capi::last_error;

bevy_hook * bevy_hook_new(bevy_cache * cache) {
    if (!cache) {
        last_error() = "bevy_hook_new needs a cache";
        return nullptr;
    }
    return guarded([&]() -> bevy_hook * { return new bevy_hook{bevy::CacheHook(cache->cache.get())}; }, nullptr);
}

void bevy_hook_free(bevy_hook * hook) {
    delete hook;
}

int32_t bevy_hook_fn(void * user_data, const bevy_moe_call * call) {
    auto * hook = static_cast<bevy_hook *>(user_data);
    return guarded([&]() -> int32_t { return hook->hook.call(call); }, -1);
}

const char * bevy_hook_last_error(const bevy_hook * hook) {
    return hook->hook.error().c_str();
}

void bevy_hook_set_gated(bevy_hook * hook, bool gated) {
    hook->hook.set_gated(gated);
}

void bevy_hook_set_gate_weight(bevy_hook * hook, int32_t weight) {
    hook->hook.set_gate_weight(weight);
}

int32_t bevy_hook_gate_weight(const bevy_hook * hook) {
    return hook->hook.gate_weight();
}

void bevy_hook_begin(bevy_hook * hook, int64_t token, int32_t count_from) {
    hook->hook.begin(token, count_from);
}

void bevy_hook_end(bevy_hook * hook, bevy_hook_usage * usage) {
    const bevy_hook_usage u = hook->hook.end();
    if (usage) {
        *usage = u;
    }
}

int64_t bevy_hook_routed(const bevy_hook * hook, const int32_t * row_ends, int32_t n_groups, int32_t * experts,
                         int64_t * offsets, int64_t max_experts, int32_t * il) {
    // const in the API (it changes no state a caller sees); the scratch flags are the hook's
    return const_cast<bevy_hook *>(hook)->hook.routed(row_ends, n_groups, experts, offsets, max_experts, il);
}

void bevy_hook_set_prefetch(bevy_hook * hook, bool enable) {
    hook->hook.set_prefetch(enable);
}
