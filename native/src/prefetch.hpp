// NextLayerPredictor: the prefetch baseline's guess. At layer il it applies layer il+1's router
// to layer il's router input (a dense top-k per token) and keeps the distinct experts; at layer
// il+1 it scores that guess against what the layer selected (precision and recall counters).
#pragma once

#include "bevy.h"

#include <cstdint>
#include <vector>

namespace bevy {

class ExpertCache;

class NextLayerPredictor {
public:
    explicit NextLayerPredictor(int32_t n_expert) : mark_(n_expert, 0), scores_(n_expert), order_(n_expert) {}

    // predict layer call->il + 1 from this call's router input (nothing without a router or input)
    void predict(const ExpertCache & cache, const bevy_moe_call * call);
    // the experts predicted for layer il (empty unless the last prediction was for il)
    const std::vector<int32_t> & predicted_for(int32_t il) const { return il == predicted_il_ ? predicted_ : none_; }
    // compare the prediction for layer il with its distinct selection; counted in the cache
    void score(ExpertCache & cache, int32_t il, const std::vector<int32_t> & selected);
    void reset() {
        predicted_.clear();
        predicted_il_ = -1;
    }

private:
    std::vector<uint8_t> mark_;    // scratch: expert flags
    std::vector<float>   scores_;  // scratch: router logits
    std::vector<int32_t> order_;   // scratch: experts by score
    std::vector<int32_t> predicted_;
    std::vector<int32_t> none_;
    int32_t              predicted_il_ = -1;
};

} // namespace bevy
