// Build-time check that bevy_moe_call and the patched llama's llama_moe_hook_call agree.
#include "bevy.h"

#include "llama-moe-hook.h"

#include <cstddef>

#define BEVY_SAME_FIELD(f)                                                                 \
    static_assert(offsetof(bevy_moe_call, f) == offsetof(llama_moe_hook_call, f) &&        \
                  sizeof(bevy_moe_call::f) == sizeof(llama_moe_hook_call::f), #f)

BEVY_SAME_FIELD(il);
BEVY_SAME_FIELD(n_expert);
BEVY_SAME_FIELD(n_expert_used);
BEVY_SAME_FIELD(n_tokens);
BEVY_SAME_FIELD(ids);
BEVY_SAME_FIELD(ids_stride);
BEVY_SAME_FIELD(out);
BEVY_SAME_FIELD(n_out_max);
BEVY_SAME_FIELD(router_in);
BEVY_SAME_FIELD(router_in_stride);
BEVY_SAME_FIELD(n_embd);
BEVY_SAME_FIELD(route_only);
BEVY_SAME_FIELD(pass);
BEVY_SAME_FIELD(batch_rows);
BEVY_SAME_FIELD(n_batch_rows);
BEVY_SAME_FIELD(batch_seq);
static_assert(sizeof(bevy_moe_call) == sizeof(llama_moe_hook_call), "bevy_moe_call size");
