// Router trace: the simplest MoE hook body, used by `bevy-gguf trace` and the hook tests.
#include "bevy.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

struct bevy_router_trace {
    int32_t                           k;
    std::vector<std::vector<int32_t>> layers; // layers[il]: rows of k ids
    mutable std::mutex                mutex;
};

bevy_router_trace * bevy_router_trace_new(int32_t n_layer, int32_t k) {
    if (n_layer <= 0 || k <= 0) {
        return nullptr;
    }
    auto * trace = new (std::nothrow) bevy_router_trace();
    if (trace) {
        trace->k = k;
        trace->layers.resize(n_layer);
    }
    return trace;
}

void bevy_router_trace_free(bevy_router_trace * trace) {
    delete trace;
}

int32_t bevy_router_trace_hook(void * user_data, const bevy_moe_call * call) {
    auto * trace = static_cast<bevy_router_trace *>(user_data);
    if (call->il < 0 || call->il >= (int32_t) trace->layers.size() || call->n_expert_used != trace->k) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(trace->mutex);
    auto & rows = trace->layers[call->il];
    const int32_t k = call->n_expert_used;
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        const int32_t * row = call->ids + t * call->ids_stride;
        rows.insert(rows.end(), row, row + k);
        std::memcpy(call->out + (size_t) t * k, row, k * sizeof(int32_t));
    }
    return 0;
}

int64_t bevy_router_trace_rows(const bevy_router_trace * trace, int32_t il) {
    if (il < 0 || il >= (int32_t) trace->layers.size()) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(trace->mutex);
    return (int64_t) trace->layers[il].size() / trace->k;
}

int64_t bevy_router_trace_read(
        const bevy_router_trace * trace, int32_t il, int64_t first, int64_t n, int32_t * out) {
    if (il < 0 || il >= (int32_t) trace->layers.size() || first < 0 || n < 0) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(trace->mutex);
    const auto & rows  = trace->layers[il];
    const int64_t have = (int64_t) rows.size() / trace->k;
    const int64_t take = std::max<int64_t>(0, std::min(n, have - first));
    if (take > 0) {
        std::memcpy(out, rows.data() + first * trace->k, (size_t) take * trace->k * sizeof(int32_t));
    }
    return take;
}

void bevy_router_trace_clear(bevy_router_trace * trace) {
    std::lock_guard<std::mutex> lock(trace->mutex);
    for (auto & rows : trace->layers) {
        rows.clear();
    }
}
