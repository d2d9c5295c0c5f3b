// bevy-gguf native core: C API of libbevy.
//
// libbevy holds what runs on the hot path beside llama.cpp: the bodies of the per-context MoE
// hook that the patch series adds to libllama (llama_set_moe_hook), the expert cache, the upload
// queue and the links. It does not link libllama: Python hands the function pointers of this
// library to llama_set_moe_hook.
//
// Conventions: opaque handles, every *_new has its *_free, no exceptions cross this boundary.
// Return values: int32_t is a status (0 on success, a negative code on failure, and
// bevy_last_error() or the hook's last error says why); int64_t is a count (-1 on failure);
// uint64_t is a counter or a version; bool answers a question; a *_new returns NULL on failure.
// Each enum, struct and counter is defined here once; the C++ core uses these definitions and
// the Python bindings check theirs against bevy_abi() when they load.
#pragma once

#include <stdbool.h>
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
    int32_t         route_only;       // 1: a layer-range lookahead (llama_decode_layers): out is ignored
    int32_t         pass;             // 0: one pass; two passes (llama_moe_set_two_pass): 1: -1 in out for
                                      // an expert still loading; 2: -1 for every expert pass 1 computed
    const int32_t * batch_rows;       // token t's row in the batch being decoded (with a KV stream per sequence
                                      // llama.cpp runs a batch as ubatches in another order); NULL: not known
    int32_t         n_batch_rows;     // rows in that batch
    int32_t         batch_seq;        // changes with every batch (llama_decode, llama_decode_layers call)
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

// Rows (tokens) recorded so far for layer il, in batch order (each batch's rows in its own order,
// however llama.cpp split it into ubatches); -1 for a bad layer.
BEVY_API int64_t bevy_router_trace_rows(bevy_router_trace * trace, int32_t il);

// Copies rows [first, first + n) of layer il into out (n*k ids). Returns rows copied, or -1.
BEVY_API int64_t bevy_router_trace_read(
        bevy_router_trace * trace, int32_t il, int64_t first, int64_t n, int32_t * out);

// Forgets every recorded row.
BEVY_API void bevy_router_trace_clear(bevy_router_trace * trace);

//
// Errors: a failed call returns NULL or a negative code; bevy_last_error() says why (per thread).
//

BEVY_API const char * bevy_last_error(void);

//
// Links: how expert bytes reach the cache from the slow tier.
//

typedef struct bevy_link bevy_link;

// O_DIRECT preads of path (buffered where the file system refuses O_DIRECT; describe() says so)
BEVY_API bevy_link * bevy_link_file_new(const char * path);
// an in-memory copy of the n ranges [offsets[i], offsets[i] + sizes[i]) of path, read now
BEVY_API bevy_link * bevy_link_ram_new(const char * path, const uint64_t * offsets, const uint64_t * sizes, int32_t n);
// a token bucket of bytes_per_s over inner, which it takes over (do not free inner)
BEVY_API bevy_link * bevy_link_throttle_new(bevy_link * inner, double bytes_per_s);
// faults for tests over inner, which it takes over: by read count (1-based), every error_every-th
// read fails, every short_every-th reads half and fails as a short read, every stall_every-th
// first sleeps stall_s seconds (0: never); emulated
BEVY_API bevy_link * bevy_link_fault_new(bevy_link * inner, int64_t error_every, int64_t short_every,
                                         int64_t stall_every, double stall_s);
BEVY_API void        bevy_link_free(bevy_link * link);
// writes a one-line description (e.g. "emulated 200 MB/s over file (O_DIRECT)") into buf,
// truncated to size - 1 bytes; returns the description's full length
BEVY_API int64_t     bevy_link_describe(const bevy_link * link, char * buf, int64_t size);
// true when the link is emulated (a throttle)
BEVY_API bool        bevy_link_emulated(const bevy_link * link);
// reads so far that went through a bounce buffer: O_DIRECT ones whose offset, size or dst is
// not 4 KiB aligned (each costs a copy; a model written with general.alignment 4096 has none)
BEVY_API uint64_t    bevy_link_bounced(const bevy_link * link);
// copies [offset, offset + nbytes) of the slow tier to dst; 0, or -1 (bevy_last_error says why)
BEVY_API int32_t     bevy_link_read(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst);
// bevy_link_read where the link may also write `before` bytes ahead of dst and `after` bytes past
// dst + nbytes (scratch): an O_DIRECT file link then reads an expert that does not start a page
// straight in (its page-aligned superset), where dst sits at the offset's place in a page
BEVY_API int32_t     bevy_link_read_padded(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst,
                                           uint64_t before, uint64_t after);

//
// Expert cache: one pool of slots in fast memory, in slot classes: the layers whose experts
// have the same bytes per kind share a class (a model from llama-quantize's mixes has several,
// e.g. ffn_down Q6_K in some layers, Q4_K in others), and an expert of layer il takes a slot of
// il's class. Class c owns slots [first_c, first_c + class_slots[c]) (first_c: the slots of
// the classes before it); slot s of kind k lives at bevy_cache_class_data(cache, c, k) +
// (s - first_c) * class_kind_stride[c][k] (0: class_kind_bytes[c][k]), and an expert of layer il
// starts bevy_cache_slot_phase(cache, il, k) bytes into it. One class (n_classes 0): kind_bytes
// and n_slots.
//

#define BEVY_MAX_KINDS 8
#define BEVY_MAX_CLASSES 16
#define BEVY_DENSE_LAYER (-1) // layer_class of a layer without routed experts (a dense leading layer)

enum bevy_policy {
    BEVY_POLICY_LRU      = 0, // reference
    BEVY_POLICY_NEXT_USE = 1, // default: estimated next use (distance in the layer cycle, frequency)
    BEVY_POLICY_RANDOM   = 2, // stress tests
};

typedef struct bevy_cache_params {
    int32_t  n_layer;                     // layers (expert keys are (layer, expert))
    int32_t  n_expert;                    // routed experts per layer
    int32_t  n_kinds;                     // tensors per expert (gate, up, down, scales, ...)
    uint64_t kind_bytes[BEVY_MAX_KINDS];  // bytes of one expert of each kind (the tensor's nb[2])
    int64_t  n_slots;                     // experts the pool holds
    int32_t  policy;                      // enum bevy_policy
    int32_t  n_workers;                   // upload threads
    int32_t  wait_timeout_ms;             // a hook waiting longer fails its decode; 0 = no limit
    uint64_t seed;                        // for BEVY_POLICY_RANDOM
    int32_t  n_classes;                   // slot classes; 0: one, of kind_bytes and n_slots
    int64_t  class_slots[BEVY_MAX_CLASSES];                     // slots of each class (their sum: n_slots)
    uint64_t class_kind_bytes[BEVY_MAX_CLASSES][BEVY_MAX_KINDS]; // bytes of one expert of each kind, per class
    const int32_t * layer_class;          // n_layer entries: each layer's class, or BEVY_DENSE_LAYER (copied; NULL: every layer class 0)
    int32_t  external_slots;              // 1: libbevy allocates no slot memory: the caller gives each (class, kind)'s
                                          // (bevy_cache_set_class_data; a device's memory, such as llama_moe_slots_new's)
                                          // and a writer for every (layer, kind) before any load; 0: host memory of its own
    uint64_t class_kind_stride[BEVY_MAX_CLASSES][BEVY_MAX_KINDS]; // bytes from one slot of each kind to the next, per
                                          // class (0: class_kind_bytes, packed; with one class, [0]); whole pages above
                                          // the kind's bytes (slots of libbevy's own only) leave room in each slot for an
                                          // O_DIRECT read of an expert that does not start a page (bevy_cache_slot_phase)
} bevy_cache_params;

// The counters, X(name, what): per layer unless "totals only"; bevy_counter_name(i) names the
// i-th, in struct order, so that bindings build their struct from this one list.
#define BEVY_COUNTERS(X)                                                                        \
    X(hits,            "distinct experts of a hook call that were resident or in flight")     \
    X(misses,          "... that had to be loaded")                                           \
    X(loads,           "loads completed")                                                     \
    X(bytes_loaded,    "bytes those loads moved")                                             \
    X(evictions,       "experts evicted to make room")                                        \
    X(stall_ns,        "time hooks and schedulers waited for loads")                          \
    X(link_busy_ns,    "time at least one load was in flight (totals only)")                  \
    X(prefetch_loads,  "loads issued on a prediction (also in loads, bytes_loaded)")          \
    X(prefetch_hits,   "predicted experts the layer then selected")                           \
    X(prefetch_wasted, "predicted experts it did not select")                                 \
    X(prefetch_missed, "selected experts that were not predicted")                            \
    X(compute_busy_ns, "time at least one gated context computed (totals only)")            \
    X(compute_used_ns, "compute time weighted by the share of the gate in use (totals only)")   \
    X(second_pass,     "experts a layer computed in a second pass, after their loads")

typedef struct bevy_counters {
#define BEVY_COUNTER_FIELD(name, what) uint64_t name;
    BEVY_COUNTERS(BEVY_COUNTER_FIELD)
#undef BEVY_COUNTER_FIELD
} bevy_counters;

// the name of counter i (struct order), or NULL past the last
BEVY_API const char * bevy_counter_name(int32_t i);

typedef struct bevy_cache bevy_cache;

BEVY_API bevy_cache_params bevy_cache_default_params(void);
// link is borrowed: it must outlive the cache
BEVY_API bevy_cache * bevy_cache_new(const bevy_cache_params * params, bevy_link * link);
BEVY_API void         bevy_cache_free(bevy_cache * cache);
// expert e of kind k at layer il lies at offset + e * (bytes of kind k in il's class) of the slow tier
BEVY_API int32_t      bevy_cache_set_source(bevy_cache * cache, int32_t il, int32_t kind, uint64_t offset);
// A slot layout other than the file's (ggml-cpu's repacked one: llama_moe_write_repacked has this
// signature): writes one expert, a [ne0, ne1] matrix of ggml type `type` whose file bytes are at
// src, into dst; 0, or -1 on failure.
typedef int32_t (*bevy_slot_writer_fn)(int32_t type, int64_t ne0, int64_t ne1, void * dst, const void * src, uint64_t nbytes);
// experts of kind k at layer il are read into a staging buffer of the worker and written into their
// slot by fn (NULL: read straight into the slot, the default); set before any load
BEVY_API int32_t      bevy_cache_set_writer(bevy_cache * cache, int32_t il, int32_t kind, bevy_slot_writer_fn fn,
                                            int32_t type, int64_t ne0, int64_t ne1);
// Where an upload worker's staging buffer (what a slot writer's expert is read into) comes from: by
// default 4 KiB-aligned host memory; alloc(user, nbytes, &handle) may give other memory (pinned
// host memory, which a GPU copies from at full speed: llama_moe_host_alloc has this signature) or
// NULL for the default; free(handle) gives it back. Set before any load.
typedef void * (*bevy_staging_alloc_fn)(void * user, uint64_t nbytes, void ** handle);
typedef void   (*bevy_staging_free_fn)(void * handle);
BEVY_API int32_t      bevy_cache_set_staging(bevy_cache * cache, bevy_staging_alloc_fn alloc, bevy_staging_free_fn free,
                                             void * user);
// staging buffers alloc has given so far (the others: default host memory)
BEVY_API int64_t      bevy_cache_staging_given(const bevy_cache * cache);
// where layer il's expert of kind k starts inside its slot: the expert's file offset modulo a
// page where its bytes are whole pages and its class's stride for k is a page more (the read of
// its page-aligned superset then lands in the slot with no copy), else 0; -1 on a bad layer or kind.
// Set the layer's source (bevy_cache_set_source) first.
BEVY_API int64_t      bevy_cache_slot_phase(const bevy_cache * cache, int32_t il, int32_t kind);
// the slots of kind k of class c; NULL on a bad class or kind (or external slots not given yet)
BEVY_API void *       bevy_cache_class_data(bevy_cache * cache, int32_t c, int32_t kind);
// external_slots: where the slots of kind k of class c live (class_slots[c] x class_kind_bytes[c][k]
// bytes, which libbevy only hands to writers, never reads or writes itself); set before any load
BEVY_API int32_t      bevy_cache_set_class_data(bevy_cache * cache, int32_t c, int32_t kind, void * data);
// layer il's counters (il = -1: totals); -1 on a bad layer
BEVY_API int32_t      bevy_cache_counters(const bevy_cache * cache, int32_t il, bevy_counters * out);
// slots pinned right now (0 when no graph is running)
BEVY_API int64_t      bevy_cache_pinned(const bevy_cache * cache);

//
// The cache hook of one llama context: install with
// llama_set_moe_hook(ctx, bevy_hook_fn, hook, false) after llama_set_moe_cache. At each MoE
// layer it unpins the previous layer's slots, pins (loading, and waiting for, the missing
// ones) a slot for every selected expert, and returns the slot ids; il = -1 (graph done)
// unpins.
//

typedef struct bevy_hook bevy_hook;

BEVY_API bevy_hook *   bevy_hook_new(bevy_cache * cache);
BEVY_API void          bevy_hook_free(bevy_hook * hook);
BEVY_API int32_t       bevy_hook_fn(void * hook, const bevy_moe_call * call);
// why the last call of this hook failed ("" if it did not)
BEVY_API const char *  bevy_hook_last_error(const bevy_hook * hook);

//
// Runahead: contexts on their own threads, each with its hook, share the cache's compute
// gate. A gated hook leaves the gate while it waits for experts and re-enters to compute;
// among the contexts waiting to compute, the most lagging (smallest token, then layer) goes
// first. The gate's busy time is the compute busy time of every gated context.
//

// gated contexts computing at once (default 1)
BEVY_API int32_t bevy_cache_set_concurrency(bevy_cache * cache, int32_t n);
// learning off: hook calls pin and load as ever but leave the eviction's usage statistics as
// they are (decodes that are not the workload, such as start-up calibrations); default on
BEVY_API void    bevy_cache_set_learning(bevy_cache * cache, bool on);
// entries of the table of contexts sharing the cache (scanned at each eviction): hooks freed give
// their entry to the next hook, so it stays at the most hooks that were ever alive at once
BEVY_API int32_t bevy_cache_context_entries(const bevy_cache * cache);
BEVY_API void    bevy_hook_set_gated(bevy_hook * hook, bool gated);
// the share of the gate's capacity (bevy_cache_set_concurrency) the hook's next decodes ask for:
// 1 (the default), or the capacity for a decode on every thread, which computes alone. A decode
// gets it where no other context computes at its turn, else 1 (it never waits for the room);
// bevy_hook_gate_weight, after bevy_hook_begin, says which it got
BEVY_API void    bevy_hook_set_gate_weight(bevy_hook * hook, int32_t weight);
BEVY_API int32_t bevy_hook_gate_weight(const bevy_hook * hook);
// before each llama_decode of the hook's context: its progress (the token it decodes), from
// which layer on its hits and misses count (0: all; a scheduler that counted earlier layers at
// bevy_cache_refresh passes the first it did not), and entering the gate; bevy_hook_end after
// the decode (idempotent: graph done leaves too)
BEVY_API void    bevy_hook_begin(bevy_hook * hook, int64_t token, int32_t count_from);
// What a decode used since bevy_hook_begin, for a cost model of calls.
typedef struct bevy_hook_usage {
    int64_t experts;  // experts pinned: distinct per layer, summed over its layers (what its matmuls read)
    int64_t wait_ns;  // time its layers waited for experts and for the compute gate
} bevy_hook_usage;

// usage (may be NULL): what the decode used since bevy_hook_begin
BEVY_API void    bevy_hook_end(bevy_hook * hook, bevy_hook_usage * usage);

//
// Self-balancing scheduling (llama_decode_layers): the scheduler learns each request's next
// experts from a route-only lookahead, asks the cache which are loaded (starting the loads of
// the absent ones), runs groups of ready requests, and waits for loads when none is ready.
//

// A request in flight, as a scheduling pass sees it: the layer it computes next and the
// distinct experts that layer needs (from the lookahead).
typedef struct bevy_flight {
    int32_t         layer;      // 0 <= layer < n_layer
    int32_t         n_experts;
    const int32_t * experts;    // distinct expert ids of that layer
    uint64_t        priority;   // of its loads (smaller = sooner: the lagging first)
    uint8_t         admit;      // reserve its resident experts and queue loads of the absent ones
    uint8_t         count;      // count its lookups (once per revealed layer)
    int32_t         absent;     // out: experts it still lacks (queued loads included)
    int64_t         eta_ns;     // out: when its loads will have landed, from now (0: nothing lacks; -1: not
                                //      admitted, nothing loads for it): the loads queued or running at its
                                //      priority or better, n_workers at a time, at the recent time per load
} bevy_flight;

// What a pass learns beyond its flights.
typedef struct bevy_pass {
    uint64_t   version;   // out: the cache's version as the pass began (bevy_cache_wait's since)
    int32_t    n_layer;   // in: entries of hits and misses to fill (0: none)
    uint64_t * hits;      // out: per layer, lookups that hit so far (after this pass's)
    uint64_t * misses;    // out: ... that missed
    int64_t    load_ns;   // out: the recent average time of one load (0 before any; bevy_cache_load_ns)
} bevy_pass;

// One scheduling pass of an owner (a scheduler sharing the cache, 0 <= owner < 64) over its n
// flights, under one lock: their layers become the owner's upcoming ones (next-use eviction
// keeps what every owner's flights need), the owner's earlier reservations are dropped, the
// resident experts of the admitted flights are reserved, then their absent ones are queued for
// loading, in flight order, at their priorities. A queued load takes (evicts) its slot only
// when a link worker starts it, and the slot joins the owner's reservations until its next
// refresh if the owner's latest refresh still admits a flight that needs it (and it did not
// call bevy_cache_unreserve_all since). Sets each flight's absent, and pass (may be NULL).
// 0, or -1 (nothing changed) on a bad owner, layer or expert
BEVY_API int32_t  bevy_cache_refresh(bevy_cache * cache, int32_t owner, bevy_flight * flights, int32_t n,
                                     bevy_pass * pass);
// per layer: lookups that hit and that missed so far
BEVY_API void     bevy_cache_lookups(const bevy_cache * cache, uint64_t * hits, uint64_t * misses, int32_t n_layer);
// changes whenever a load completes
BEVY_API uint64_t bevy_cache_version(const bevy_cache * cache);
// the recent average time of one load (ns; 0 before any): the link's cost of an expert, with
// the link workers' loads overlapping as they did
BEVY_API int64_t  bevy_cache_load_ns(const bevy_cache * cache);
// wait until the version differs from since or timeout_ms passed (counted as stall at il);
// returns the version then (since itself: the wait timed out)
BEVY_API uint64_t bevy_cache_wait(bevy_cache * cache, uint64_t since, int32_t timeout_ms, int32_t il);
// drop every reservation the owner's bevy_cache_refresh made (its queued loads then take their
// slots unreserved)
BEVY_API void     bevy_cache_unreserve_all(bevy_cache * cache, int32_t owner);
// The selection of the last route-only call, as the distinct experts of groups of rows:
// group g is rows [row_ends[g - 1], row_ends[g]) (row_ends[-1] = 0) in batch order; its
// distinct experts, ascending, go to experts[offsets[g] .. offsets[g + 1]) (offsets has
// n_groups + 1 entries; experts room for max_experts). *il: that call's layer. Returns the
// experts written, or -1 when the rows or the room do not match the call
BEVY_API int64_t  bevy_hook_routed(const bevy_hook * hook, const int32_t * row_ends, int32_t n_groups,
                                   int32_t * experts, int64_t * offsets, int64_t max_experts, int32_t * il);

//
// Events, for timelines: off until bevy_cache_trace(cache, max_events) (0 turns them off).
// Times are CLOCK_MONOTONIC nanoseconds (Python: time.monotonic_ns()).
//

enum bevy_event_kind {
    BEVY_EVENT_WAIT    = 0, // context waits for its experts (and the gate) at layer
    BEVY_EVENT_COMPUTE = 1, // context computes layer
    BEVY_EVENT_LOAD    = 2, // one expert crosses the link (context = upload worker)
};

typedef struct bevy_event {
    int32_t kind;
    int32_t context;
    int32_t layer;
    int32_t expert;
    int64_t t0_ns;
    int64_t t1_ns;
} bevy_event;

BEVY_API void    bevy_cache_trace(bevy_cache * cache, int64_t max_events);
// moves up to max recorded events into out (oldest first); returns how many
BEVY_API int64_t bevy_cache_events(bevy_cache * cache, bevy_event * out, int64_t max);
BEVY_API int64_t bevy_now_ns(void);

//
// Prefetch (the predictive baseline): at layer il the hook applies layer il+1's router to
// layer il's router input (install the hook with want_router_in = true) and loads the
// predicted experts behind the demand loads, into the same cache.
//

// layer il's router weights [n_expert][n_embd] (copied)
BEVY_API int32_t bevy_cache_set_router(bevy_cache * cache, int32_t il, const float * weights, int32_t n_embd);
BEVY_API void    bevy_hook_set_prefetch(bevy_hook * hook, bool enable);

//
// Replay: the hit count of a policy on a recorded access sequence, with the live cache's code.
// Step i is a visit of layer layers[i] that needs experts[offsets[i] .. offsets[i+1]) (distinct).
// Returns hits, or -1 when a step needs more experts than there are slots.
//

BEVY_API int64_t bevy_replay(int32_t policy, int32_t n_layer, int32_t n_expert, int64_t n_slots, uint64_t seed,
                             const int32_t * layers, const int64_t * offsets, const int32_t * experts, int64_t n_steps);

//
// ABI: what the bindings check at load. `what` is "sizeof:TYPE", "offsetof:TYPE.FIELD" (the
// structs above) or the name of a constant (BEVY_MAX_KINDS, BEVY_POLICY_*, BEVY_EVENT_*);
// returns its value, or -1 for a name it does not know.
//

BEVY_API int64_t bevy_abi(const char * what);
