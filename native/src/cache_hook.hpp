// CacheHook: the MoE hook of one llama context served by the expert cache.
//
// At each MoE layer it unpins the previous layer's slots (their matmuls are done: the hook op
// runs after them in graph order, and on a GPU ggml_backend_sched syncs before a CPU op), pins a
// slot for each distinct selected expert (loading, and waiting for, the missing ones) and
// rewrites the ids to slot ids; il = -1 (graph done) unpins. A route-only call (the layer-range
// lookahead) records the selection and loads nothing. Gated hooks take turns at the cache's
// compute gate, leaving it while they wait for experts.
#pragma once

#include "bevy.h"
#include "expert_cache.hpp"
#include "prefetch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace bevy {

class CacheHook {
public:
    explicit CacheHook(ExpertCache * cache);
    ~CacheHook();
    CacheHook(const CacheHook &) = delete;
    CacheHook & operator=(const CacheHook &) = delete;

    // the hook body (bevy_hook_fn): 0, or -1 with error()
    int32_t call(const bevy_moe_call * call);
    const std::string & error() const { return error_; }

    void set_gated(bool gated);
    // the share of the gate's capacity this context's next decodes ask for (default 1; the
    // capacity: it computes alone, as a call on every thread must): a decode gets it where the
    // gate is empty at its turn, else 1 (gate_weight says which, after begin)
    void set_gate_weight(int32_t weight) { gate_weight_ = weight > 0 ? weight : 1; }
    int32_t gate_weight() const { return held_weight_; }
    void set_prefetch(bool on) {
        prefetch_ = on;
        predictor_.reset();
    }
    // before a decode: the token it decodes (its progress), the first layer whose lookups it
    // counts, and a turn at the gate
    void begin(int64_t token, int32_t count_from);
    // after it (idempotent: graph done leaves the gate too); what it used since begin
    bevy_hook_usage end();
    // the distinct experts of groups of rows of the last route-only call (bevy_hook_routed)
    int64_t routed(const int32_t * row_ends, int32_t n_groups, int32_t * experts, int64_t * offsets,
                   int64_t max_experts, int32_t * il);

private:
    int32_t layer_call(const bevy_moe_call * call);  // call() unless an earlier layer failed the decode
    void leave_gate();
    bool enter_gate(int32_t il);    // false: timed out (the cache's wait timeout), error_ says so
    void end_compute(int64_t now);  // the layer computed since the last hook is done
    int32_t record_route(const bevy_moe_call * call);
    int32_t second_pass(const bevy_moe_call * call, int64_t t_enter);
    int32_t start_compute(int32_t il, int64_t t_enter, int32_t rc);

    ExpertCache *        cache_;
    int32_t              id_;               // registration in the cache (its position steers eviction)
    std::vector<int64_t> pins_;             // slots of the layer the context computes now
    std::vector<int32_t> distinct_;         // scratch: distinct experts of a call
    std::vector<int64_t> slots_;            // scratch: their slots
    std::vector<int64_t> slot_of_;          // scratch: expert -> slot for this call
    std::vector<uint8_t> ready_;            // scratch: which of distinct_ were loaded (two passes)
    std::vector<int32_t> rest_experts_;     // two passes: the experts pass 1 left to pass 2,
    std::vector<int64_t> rest_slots_;       // their slots,
    int32_t              rest_il_ = -1;     // and their layer
    std::string          error_;

    ComputeGate *        gate_    = nullptr; // the cache's gate when this context is gated
    bool                 holding_ = false;
    int32_t              gate_weight_ = 1;   // what it enters with
    int32_t              held_weight_ = 1;   // what this decode got at begin (it leaves and re-enters with it)
    bool                 failed_  = false;   // a hook call of this decode failed: the others fail at once
    int64_t              token_   = 0;       // the token this context decodes (its progress)
    bevy_hook_usage      usage_ = {0, 0};    // since begin: experts pinned (summed per layer), time waited
    int32_t              computing_ = -1;    // the layer it computes since computing_since_ (-1: none)
    int64_t              computing_since_ = 0;

    int32_t              count_from_ = 0;    // count hits and misses at layers from this one on
    std::vector<int32_t> routed_;            // ids of the last route-only call, by batch row, token-major
    std::vector<uint8_t> seen_;              // scratch: expert flags
    int32_t              routed_il_ = -1;
    int32_t              routed_k_  = 0;
    int32_t              routed_seq_ = -1;          // the batch (bevy_moe_call::batch_seq) routed_ holds

    bool                 prefetch_ = false;  // predict layer il + 1 from layer il's router input
    NextLayerPredictor   predictor_;
};

} // namespace bevy
