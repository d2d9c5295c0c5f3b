// bevy-gguf native core: C API of libbevy.
//
// libbevy holds what runs on the hot path beside llama.cpp: the bodies of the per-context MoE
// hook that patches/0001 adds to libllama (llama_set_moe_hook), and, as the backend grows, the
// expert cache, the upload queue and the links. It does not link libllama: Python hands the
// function pointers of this library to llama_set_moe_hook.
//
// Conventions: opaque handles, every *_new has its *_free, no exceptions cross this boundary,
// functions returning int32_t return 0 on success and a negative code on failure.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define BEVY_API extern "C" __attribute__((visibility("default")))
#else
#define BEVY_API __attribute__((visibility("default")))
#endif

// What the MoE hook sees at one layer of one graph evaluation. Layout-identical to
// llama_moe_hook_call in patches/0001 (native/src/abi_check.cpp asserts it at build time).
typedef struct bevy_moe_call {
    int32_t         il;               // layer index
    int32_t         n_expert;         // routed experts of the layer
    int32_t         n_expert_used;    // experts selected per token (k)
    int32_t         n_tokens;         // tokens in the ubatch
    const int32_t * ids;              // token t, rank j at ids[t*ids_stride + j]
    int64_t         ids_stride;       // elements between token rows
    int32_t       * out;              // ids for the expert matmuls: out[t*n_expert_used + j]
    int32_t         n_out_max;        // out values must lie in [0, n_out_max)
    const float   * router_in;        // router input rows, or NULL unless requested
    int64_t         router_in_stride; // elements between router input rows
    int32_t         n_embd;
} bevy_moe_call;

// The hook signature llama_set_moe_hook takes.
typedef int32_t (*bevy_moe_hook_fn)(void * user_data, const bevy_moe_call * call);

//
// Router trace: records, per layer, the experts every token selected, in arrival order, and
// passes the ids through unchanged (so the model computes exactly as without a hook).
//

typedef struct bevy_router_trace bevy_router_trace;

// n_layer: layers to record; k: experts per token. Returns NULL on bad arguments.
BEVY_API bevy_router_trace * bevy_router_trace_new(int32_t n_layer, int32_t k);
BEVY_API void                bevy_router_trace_free(bevy_router_trace * trace);

// The hook body: install with llama_set_moe_hook(ctx, bevy_router_trace_hook, trace, false).
// Returns -1 (failing the decode) when a layer or k does not match the trace.
BEVY_API int32_t bevy_router_trace_hook(void * trace, const bevy_moe_call * call);

// Rows (tokens) recorded so far for layer il; -1 for a bad layer.
BEVY_API int64_t bevy_router_trace_rows(const bevy_router_trace * trace, int32_t il);

// Copies rows [first, first + n) of layer il into out (n*k ids). Returns rows copied, or -1.
BEVY_API int64_t bevy_router_trace_read(
        const bevy_router_trace * trace, int32_t il, int64_t first, int64_t n, int32_t * out);

// Forgets every recorded row.
BEVY_API void bevy_router_trace_clear(bevy_router_trace * trace);
