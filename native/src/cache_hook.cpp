#include "cache_hook.hpp"

#include <algorithm>
#include <cstring>

namespace bevy {

CacheHook::CacheHook(ExpertCache * cache)
    : cache_(cache), id_(cache->register_context()), slot_of_(cache->config().n_expert, -1),
      seen_(cache->config().n_expert, 0), predictor_(cache->config().n_expert) {}

CacheHook::~CacheHook() {
    leave_gate();
    cache_->release(pins_);
    cache_->unregister_context(id_);
}

void CacheHook::leave_gate() {
    if (holding_) {
        gate_->leave(held_weight_);
        holding_ = false;
    }
}

bool CacheHook::enter_gate(int32_t il) {
    const int32_t timeout_ms = cache_->config().wait_timeout_ms;
    // the decode's first turn takes the weight asked for if the gate is empty, else 1; its later
    // turns (after a wait for experts) take what the first got: its threads are set for the call
    const bool    first  = il < 0;
    const int32_t weight = first ? gate_weight_ : held_weight_;
    if (const int32_t got = gate_->enter(gate_key(token_, il, id_), timeout_ms, weight, first)) {
        holding_     = true;
        held_weight_ = got;
        return true;
    }
    error_ = "timed out after " + std::to_string(timeout_ms) + " ms waiting for the compute gate at layer " +
             std::to_string(il) + " (another context computed that long)";
    return false;
}

void CacheHook::end_compute(int64_t now) {
    if (computing_ >= 0) {
        cache_->events().add({kEventCompute, id_, computing_, -1, computing_since_, now});
        computing_ = -1;
    }
}

int32_t CacheHook::start_compute(int32_t il, int64_t t_enter, int32_t rc) {
    // after a hook call at layer il (rc: its result): the gate lets this context compute, and the
    // time since t_enter was a wait
    if (rc == 0 && gate_ && !enter_gate(il)) {
        rc = -1;
    }
    const int64_t t_start = now_ns();
    cache_->events().add({kEventWait, id_, il, -1, t_enter, t_start});
    usage_.wait_ns += t_start - t_enter;
    if (rc == 0) {
        computing_       = il;
        computing_since_ = t_start;
    }
    return rc;
}

void CacheHook::set_gated(bool gated) {
    leave_gate();
    gate_ = gated ? &cache_->gate() : nullptr;
}

void CacheHook::begin(int64_t token, int32_t count_from) {
    token_              = token;
    count_from_         = count_from;
    usage_              = {0, 0};
    failed_             = false;
    if (gate_ && !holding_) {
        failed_ = !enter_gate(-1); // the decode's first hook call fails it
    }
}

bevy_hook_usage CacheHook::end() {
    failed_ = false; // the next decode starts afresh
    leave_gate();
    end_compute(now_ns());
    return usage_;
}

int64_t CacheHook::routed(const int32_t * row_ends, int32_t n_groups, int32_t * experts, int64_t * offsets,
                          int64_t max_experts, int32_t * il) {
    if (il) {
        *il = routed_il_;
    }
    const int64_t n_rows = routed_k_ > 0 ? (int64_t) routed_.size() / routed_k_ : 0;
    int64_t n = 0;
    offsets[0] = 0;
    for (int32_t g = 0; g < n_groups; ++g) {
        const int64_t first = g == 0 ? 0 : row_ends[g - 1];
        const int64_t last  = row_ends[g];
        if (first > last || last > n_rows) {
            return -1;
        }
        const int64_t start = n;
        for (int64_t i = first * routed_k_; i < last * routed_k_; ++i) {
            const int32_t e = routed_[i];
            if (e < 0 || e >= (int32_t) seen_.size() || (!seen_[e] && n >= max_experts)) {
                for (int64_t j = start; j < n; ++j) {
                    seen_[experts[j]] = 0;
                }
                return -1;
            }
            if (!seen_[e]) {
                seen_[e]     = 1;
                experts[n++] = e;
            }
        }
        for (int64_t j = start; j < n; ++j) {
            seen_[experts[j]] = 0;
        }
        std::sort(experts + start, experts + n);
        offsets[g + 1] = n;
    }
    return n;
}

int32_t CacheHook::record_route(const bevy_moe_call * call) {
    // rows by batch row: with a KV stream per sequence a call's ubatches come in another order,
    // each with a lookahead of its own, and together they cover every row of the batch
    const int32_t k = call->n_expert_used;
    const int32_t n_rows = call->batch_rows ? call->n_batch_rows : call->n_tokens;
    if (!call->batch_rows || call->batch_seq != routed_seq_ || routed_k_ != k) {
        routed_.assign((size_t) n_rows * k, -1);
    }
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        const int32_t row = call->batch_rows ? call->batch_rows[t] : t;
        if (row < 0 || row >= n_rows) {
            error_ = "a lookahead token's batch row " + std::to_string(row) + " is outside the batch";
            return -1;
        }
        for (int32_t j = 0; j < k; ++j) {
            routed_[(size_t) row * k + j] = call->ids[t * call->ids_stride + j];
            call->out[t * k + j]          = 0;
        }
    }
    routed_il_  = call->il;
    routed_k_   = k;
    routed_seq_ = call->batch_seq;
    return 0;
}

int32_t CacheHook::call(const bevy_moe_call * call) {
    if (failed_ && call->il >= 0) {
        return -1; // an earlier layer failed this decode (error_ says why): no more waits in it
    }
    const int32_t rc = layer_call(call);
    failed_ = failed_ || rc != 0;
    return rc;
}

int32_t CacheHook::layer_call(const bevy_moe_call * call) {
    const int64_t t_enter = now_ns();
    if (call->pass == 2) {
        return second_pass(call, t_enter); // the layer's pins stay: its first pass still holds them
    }
    // The previous layer's matmuls are done: this hook op runs after them in the graph. On a CPU
    // cache that is graph order; with the slots on a GPU (--device) the hook is a CPU op between
    // GPU splits: ggml_backend_sched waits for the GPU's stream before it copies this op's input
    // (the router's ids) to the host, and that stream runs in order, so the previous layer's
    // kernels have finished reading their slots before they are unpinned here (stock's -ot
    // exps=CPU pays the same sync per MoE layer; tests/e2e/test_cuda.py runs this on CUDA).
    cache_->release(pins_);
    leave_gate();           // and this context may have to wait now
    end_compute(t_enter);
    if (call->il < 0) {
        return 0; // graph done
    }
    const int32_t n_expert = (int32_t) slot_of_.size();
    if (call->n_expert != n_expert) {
        error_ = "layer " + std::to_string(call->il) + " has " + std::to_string(call->n_expert) +
                 " experts, the cache " + std::to_string(n_expert);
        return -1;
    }
    if (call->route_only) {
        return record_route(call); // a layer-range lookahead: load nothing, compute nothing
    }
    distinct_.clear();
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        for (int32_t j = 0; j < call->n_expert_used; ++j) {
            const int32_t e = call->ids[t * call->ids_stride + j];
            if (e < 0 || e >= n_expert) {
                error_ = "selected expert " + std::to_string(e) + " is out of range";
                for (int32_t d : distinct_) {
                    slot_of_[d] = -1;
                }
                return -1;
            }
            if (slot_of_[e] == -1) {
                slot_of_[e] = -2; // seen
                distinct_.push_back(e);
            }
        }
    }
    if (prefetch_) {
        predictor_.score(*cache_, call->il, distinct_);
        predictor_.predict(*cache_, call);
    }
    const std::vector<int32_t> & next = predictor_.predicted_for(call->il + 1);
    AcquireRequest req;
    req.il         = call->il;
    req.experts    = distinct_.data();
    req.n          = (int32_t) distinct_.size();
    req.priority   = gate_key(token_, call->il, id_);
    req.context    = id_;
    req.prefetch   = next.empty() ? nullptr : next.data();
    req.n_prefetch = (int32_t) next.size();
    req.count      = call->il >= count_from_;
    slots_.resize(distinct_.size());
    ready_.assign(distinct_.size(), 1);
    req.ready      = call->pass == 1 ? ready_.data() : nullptr; // pass 1: compute what is loaded, wait later
    const int32_t rc = cache_->acquire(req, slots_.data(), pins_, error_);
    rest_experts_.clear();
    rest_slots_.clear();
    rest_il_ = call->il;
    const int64_t first = cache_->first_slot(call->il); // the layer's tensors index its class's slots
    for (size_t i = 0; i < distinct_.size(); ++i) {
        slot_of_[distinct_[i]] = rc == 0 && ready_[i] ? slots_[i] - first : -1; // -1: pass 2 computes it
        if (rc == 0 && !ready_[i]) {
            rest_experts_.push_back(distinct_[i]);
            rest_slots_.push_back(slots_[i]);
        }
    }
    if (rc == 0) {
        for (int32_t t = 0; t < call->n_tokens; ++t) {
            for (int32_t j = 0; j < call->n_expert_used; ++j) {
                const int32_t e = call->ids[t * call->ids_stride + j];
                call->out[t * call->n_expert_used + j] = (int32_t) slot_of_[e];
            }
        }
    }
    for (int32_t e : distinct_) {
        slot_of_[e] = -1;
    }
    if (rc == 0) {
        usage_.experts += (int64_t) distinct_.size();
    }
    return start_compute(call->il, t_enter, rc);
}

int32_t CacheHook::second_pass(const bevy_moe_call * call, int64_t t_enter) {
    // the first pass's matmuls are done: wait (off the gate) for what it left out, then compute that
    if (call->il != rest_il_) {
        error_ = "the second pass of layer " + std::to_string(call->il) + " follows a first pass of layer " +
                 std::to_string(rest_il_);
        return -1;
    }
    if (rest_experts_.empty()) { // the first pass had everything: nothing to wait for or compute
        std::fill(call->out, call->out + (size_t) call->n_tokens * call->n_expert_used, -1);
        return 0;
    }
    leave_gate();
    end_compute(t_enter);
    const int32_t rc = cache_->wait_loaded(call->il, rest_slots_.data(), (int32_t) rest_slots_.size(), error_);
    if (call->il >= count_from_) {
        cache_->count_second_pass(call->il, (int64_t) rest_experts_.size());
    }
    const int64_t first = cache_->first_slot(call->il);
    for (size_t i = 0; i < rest_experts_.size(); ++i) {
        slot_of_[rest_experts_[i]] = rest_slots_[i] - first;
    }
    const int32_t n_expert = (int32_t) slot_of_.size();
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        for (int32_t j = 0; j < call->n_expert_used; ++j) {
            const int32_t e = call->ids[t * call->ids_stride + j];
            call->out[t * call->n_expert_used + j] = e >= 0 && e < n_expert ? (int32_t) slot_of_[e] : -1;
        }
    }
    for (int32_t e : rest_experts_) {
        slot_of_[e] = -1;
    }
    return start_compute(call->il, t_enter, rc);
}

} // namespace bevy
