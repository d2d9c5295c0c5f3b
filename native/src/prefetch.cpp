#include "prefetch.hpp"

#include "expert_cache.hpp"

#include <algorithm>

namespace bevy {

void NextLayerPredictor::predict(const ExpertCache & cache, const bevy_moe_call * call) {
    reset();
    int32_t n_embd = 0;
    const float * w = cache.router(call->il + 1, &n_embd);
    if (!w || !call->router_in || call->n_embd != n_embd) {
        return;
    }
    const int32_t n_expert = (int32_t) mark_.size();
    const int32_t k        = std::min(call->n_expert_used, n_expert);
    for (int32_t t = 0; t < call->n_tokens; ++t) {
        const float * x = call->router_in + t * call->router_in_stride;
        for (int32_t e = 0; e < n_expert; ++e) {
            const float * row = w + (size_t) e * n_embd;
            float acc = 0.0f;
            for (int32_t d = 0; d < n_embd; ++d) {
                acc += row[d] * x[d];
            }
            scores_[e] = acc;
            order_[e]  = e;
        }
        std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                          [&](int32_t a, int32_t b) { return scores_[a] > scores_[b]; });
        for (int32_t j = 0; j < k; ++j) {
            if (!mark_[order_[j]]) {
                mark_[order_[j]] = 1;
                predicted_.push_back(order_[j]);
            }
        }
    }
    for (int32_t e : predicted_) {
        mark_[e] = 0;
    }
    predicted_il_ = call->il + 1;
}

void NextLayerPredictor::score(ExpertCache & cache, int32_t il, const std::vector<int32_t> & selected) {
    if (predicted_il_ != il) {
        return;
    }
    for (int32_t e : selected) {
        mark_[e] = 1;
    }
    uint64_t hits = 0;
    for (int32_t e : predicted_) {
        hits += mark_[e];
    }
    for (int32_t e : selected) {
        mark_[e] = 0;
    }
    cache.score_prediction(il, hits, predicted_.size() - hits, selected.size() - hits);
}

} // namespace bevy
