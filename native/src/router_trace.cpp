// Router trace: the simplest MoE hook body, used by `bevy-gguf trace` and the hook tests.
#include "bevy.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

struct bevy_router_trace {
    int32_t                           k;
    std::vector<std::vector<int32_t>> layers;  // layers[il]: rows of k ids, in batch order
    // a batch's rows by batch row (bevy_moe_call::batch_rows), per layer: llama.cpp computes a batch
    // over a KV stream per sequence as ubatches in another order; they join layers[il] sorted by row
    // when that layer sees the next batch, or when the trace is read
    std::vector<std::vector<std::pair<int32_t, std::vector<int32_t>>>> pending;
    std::vector<int32_t>              pending_seq;  // the batch_seq each layer's pending rows are of
    mutable std::mutex                mutex;

    void flush(size_t il) {
        auto & rows = pending[il];
        std::stable_sort(rows.begin(), rows.end(), [](const auto & a, const auto & b) { return a.first < b.first; });
        for (const auto & row : rows) {
            layers[il].insert(layers[il].end(), row.second.begin(), row.second.end());
        }
        rows.clear();
    }
    void flush_all() {
        for (size_t il = 0; il < layers.size(); ++il) {
            flush(il);
        }
    }
};

bevy_router_trace * bevy_router_trace_new(int32_t n_layer, int32_t k) {
    if (n_layer <= 0 || k <= 0) {
        return nullptr;
    }
    auto * trace = new (std::nothrow) bevy_router_trace();
    if (trace) {
        trace->k = k;
        trace->layers.resize(n_layer);
        trace->pending.resize(n_layer);
        trace->pending_seq.assign(n_layer, -1);
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
    const size_t  il = (size_t) call->il;
    const int32_t k  = call->n_expert_used;
    if (!call->batch_rows || call->batch_seq != trace->pending_seq[il]) {
        trace->flush(il);
    }
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        const int32_t * row = call->ids + t * call->ids_stride;
        if (call->batch_rows) {
            trace->pending[il].emplace_back(call->batch_rows[t], std::vector<int32_t>(row, row + k));
        } else {
            trace->layers[il].insert(trace->layers[il].end(), row, row + k);
        }
        std::memcpy(call->out + (size_t) t * k, row, k * sizeof(int32_t));
    }
    trace->pending_seq[il] = call->batch_rows ? call->batch_seq : -1;
    return 0;
}

int64_t bevy_router_trace_rows(bevy_router_trace * trace, int32_t il) {
    if (il < 0 || il >= (int32_t) trace->layers.size()) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(trace->mutex);
    trace->flush_all();
    return (int64_t) trace->layers[il].size() / trace->k;
}

int64_t bevy_router_trace_read(
        bevy_router_trace * trace, int32_t il, int64_t first, int64_t n, int32_t * out) {
    if (il < 0 || il >= (int32_t) trace->layers.size() || first < 0 || n < 0) {
        return -1;
    }
    std::lock_guard<std::mutex> lock(trace->mutex);
    trace->flush_all();
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
    for (auto & rows : trace->pending) {
        rows.clear();
    }
    trace->pending_seq.assign(trace->layers.size(), -1);
}
