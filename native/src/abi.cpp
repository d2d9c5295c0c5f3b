// bevy_abi and bevy_counter_name (include/bevy.h): what the Python bindings check at load.
#include "bevy.h"

#include <cstddef>
#include <cstring>

namespace {

struct Entry {
    const char * name;
    int64_t      value;
};

#define BEVY_SIZE(T) {"sizeof:" #T, (int64_t) sizeof(T)}
#define BEVY_OFFSET(T, F) {"offsetof:" #T "." #F, (int64_t) offsetof(T, F)}
#define BEVY_CONSTANT(C) {#C, (int64_t) (C)}

const Entry kEntries[] = {
    BEVY_CONSTANT(BEVY_MAX_KINDS),
    BEVY_CONSTANT(BEVY_MAX_CLASSES),
    BEVY_CONSTANT(BEVY_DENSE_LAYER),
    BEVY_CONSTANT(BEVY_POLICY_LRU),
    BEVY_CONSTANT(BEVY_POLICY_NEXT_USE),
    BEVY_CONSTANT(BEVY_POLICY_RANDOM),
    BEVY_CONSTANT(BEVY_EVENT_WAIT),
    BEVY_CONSTANT(BEVY_EVENT_COMPUTE),
    BEVY_CONSTANT(BEVY_EVENT_LOAD),
    BEVY_SIZE(bevy_moe_call),
    BEVY_OFFSET(bevy_moe_call, il),
    BEVY_OFFSET(bevy_moe_call, n_expert),
    BEVY_OFFSET(bevy_moe_call, n_expert_used),
    BEVY_OFFSET(bevy_moe_call, n_tokens),
    BEVY_OFFSET(bevy_moe_call, ids),
    BEVY_OFFSET(bevy_moe_call, ids_stride),
    BEVY_OFFSET(bevy_moe_call, out),
    BEVY_OFFSET(bevy_moe_call, n_out_max),
    BEVY_OFFSET(bevy_moe_call, router_in),
    BEVY_OFFSET(bevy_moe_call, router_in_stride),
    BEVY_OFFSET(bevy_moe_call, n_embd),
    BEVY_OFFSET(bevy_moe_call, route_only),
    BEVY_OFFSET(bevy_moe_call, pass),
    BEVY_OFFSET(bevy_moe_call, batch_rows),
    BEVY_OFFSET(bevy_moe_call, n_batch_rows),
    BEVY_OFFSET(bevy_moe_call, batch_seq),
    BEVY_SIZE(bevy_cache_params),
    BEVY_OFFSET(bevy_cache_params, n_layer),
    BEVY_OFFSET(bevy_cache_params, n_expert),
    BEVY_OFFSET(bevy_cache_params, n_kinds),
    BEVY_OFFSET(bevy_cache_params, kind_bytes),
    BEVY_OFFSET(bevy_cache_params, n_slots),
    BEVY_OFFSET(bevy_cache_params, policy),
    BEVY_OFFSET(bevy_cache_params, n_workers),
    BEVY_OFFSET(bevy_cache_params, wait_timeout_ms),
    BEVY_OFFSET(bevy_cache_params, seed),
    BEVY_OFFSET(bevy_cache_params, n_classes),
    BEVY_OFFSET(bevy_cache_params, class_slots),
    BEVY_OFFSET(bevy_cache_params, class_kind_bytes),
    BEVY_OFFSET(bevy_cache_params, layer_class),
    BEVY_OFFSET(bevy_cache_params, external_slots),
    BEVY_OFFSET(bevy_cache_params, class_kind_stride),
    BEVY_SIZE(bevy_counters),
    BEVY_SIZE(bevy_flight),
    BEVY_OFFSET(bevy_flight, layer),
    BEVY_OFFSET(bevy_flight, n_experts),
    BEVY_OFFSET(bevy_flight, experts),
    BEVY_OFFSET(bevy_flight, priority),
    BEVY_OFFSET(bevy_flight, admit),
    BEVY_OFFSET(bevy_flight, count),
    BEVY_OFFSET(bevy_flight, absent),
    BEVY_OFFSET(bevy_flight, eta_ns),
    BEVY_SIZE(bevy_hook_usage),
    BEVY_OFFSET(bevy_hook_usage, experts),
    BEVY_OFFSET(bevy_hook_usage, wait_ns),
    BEVY_SIZE(bevy_pass),
    BEVY_OFFSET(bevy_pass, version),
    BEVY_OFFSET(bevy_pass, n_layer),
    BEVY_OFFSET(bevy_pass, hits),
    BEVY_OFFSET(bevy_pass, misses),
    BEVY_OFFSET(bevy_pass, load_ns),
    BEVY_SIZE(bevy_event),
    BEVY_OFFSET(bevy_event, kind),
    BEVY_OFFSET(bevy_event, context),
    BEVY_OFFSET(bevy_event, layer),
    BEVY_OFFSET(bevy_event, expert),
    BEVY_OFFSET(bevy_event, t0_ns),
    BEVY_OFFSET(bevy_event, t1_ns),
};

#define BEVY_COUNTER_NAME(name, what) #name,
const char * const kCounterNames[] = {BEVY_COUNTERS(BEVY_COUNTER_NAME)};
#undef BEVY_COUNTER_NAME

} // namespace

int64_t bevy_abi(const char * what) {
    if (!what) {
        return -1;
    }
    for (const Entry & e : kEntries) {
        if (std::strcmp(e.name, what) == 0) {
            return e.value;
        }
    }
    return -1;
}

const char * bevy_counter_name(int32_t i) {
    const int32_t n = (int32_t) (sizeof(kCounterNames) / sizeof(kCounterNames[0]));
    return i >= 0 && i < n ? kCounterNames[i] : nullptr;
}
