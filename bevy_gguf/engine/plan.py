"""The self-balancing scheduler's plan: which requests compute which layer next.

Every request in flight decodes a block of tokens (a prompt chunk, or one token) layer by
layer. After each layer-range call the block stands before a layer whose experts it has just
revealed (the router lookahead); it is ready when they are loaded. The policy (`plan`) is pure:
given where the flights stand, it returns the group to run next, vLLM-style.

Policy (parameters in PolicyParams):
- lagging first: the ready flight furthest behind (fewest tokens decoded, then lowest layer)
  chooses the layer; the group is every ready flight at that layer, lagging first, as long as
  the group's tokens fit one call (max_tokens) and its experts fit the cache (max_experts);
- loads go to the front: only flights within load_window layers of the most lagging flight
  have their experts loaded (and held); flights further ahead run only on experts that are
  resident anyway, so running ahead never costs link bytes (when the link is the limit, bytes
  are what decide), and the front is never starved;
- a group that holds every flight (nobody could run while it stalls) extends its call through
  the following layers where it expects fewer than merge_misses misses (the runner's recent
  miss rates): when misses are rare whole steps run in one call, as in the batched runner;
- with `hold_decode`, no flight decodes a generated token while another still prefills (so
  the phases separate, as in the batched runner);
- nothing ready: wait for a load (Plan.group is None).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

FIRST = -1  # a block not started yet: its first call embeds it and runs layer 0's attention and router


@dataclass(slots=True)
class Flight:
    """A request in flight: the block it decodes now and where that block stands."""

    index: int                       # the request's index
    seq: int                         # its sequence id in the context
    tokens: list[int]                # the block: a prompt chunk or one token
    pos0: int                        # position of the block's first token
    progress: int = 0                # tokens of the request decoded so far (lagging first)
    prefill: bool = True             # the block is (part of) the prompt
    layer: int = FIRST               # the layer the block computes next
    experts: tuple[int, ...] = ()    # distinct experts that layer needs (from the lookahead)
    ready: bool = True               # those experts are loaded
    counted: bool = True             # its lookups were counted (once per revealed layer)
    h: np.ndarray | None = field(default=None, repr=False)  # [tokens, n_embd] entering `layer`

    @property
    def lag(self) -> tuple[int, int]:
        return self.progress, self.layer

    def depth(self, n_layer: int) -> int:
        """Layers computed so far, over all its tokens (FIRST counts as the start of a token)."""
        return self.progress * (n_layer + 1) + self.layer + 1


@dataclass(frozen=True, slots=True)
class Group:
    """One llama_decode_layers call: these flights, at this layer."""

    members: tuple[int, ...]  # indices into the flight list
    layer: int                # FIRST or 0..n_layer-1

    def layer_range(self, n_layer: int, end: int | None = None) -> tuple[int, int, bool, bool]:
        """(il_begin, il_end, lookahead, reuse) of the call: full layers up to `end` (default:
        the group's layer alone), then the lookahead of layer `end` unless it is the last."""
        begin = 0 if self.layer == FIRST else self.layer
        if end is None:
            end = 0 if self.layer == FIRST else self.layer + 1
        return begin, end, end < n_layer, self.layer != FIRST


@dataclass(frozen=True, slots=True)
class Plan:
    group: Group | None             # None: nothing is ready, wait for a load
    waiting: tuple[int, ...] = ()   # flights whose experts are not loaded yet


@dataclass(frozen=True, slots=True)
class PolicyParams:
    n_layer: int
    max_tokens: int           # tokens per call (the context's batch)
    max_experts: int          # distinct experts one call may pin (the cache's slots)
    hold_decode: bool = True  # no generated token decodes while a prompt still prefills
    load_window: int = 0      # layers ahead of the most lagging flight whose loads are started
                              # (the runner's default: n_layer + 1, one token)


def plan(flights: list[Flight], params: PolicyParams) -> Plan:
    """The next group to run (lagging first), or a wait."""
    holding = params.hold_decode and any(f.prefill for f in flights)
    eligible = [i for i, f in enumerate(flights) if f.ready and not (holding and not f.prefill)]
    waiting = tuple(i for i, f in enumerate(flights) if not f.ready)
    if not eligible:
        return Plan(None, waiting)
    lead = min(eligible, key=lambda i: flights[i].lag)
    layer = flights[lead].layer
    members: list[int] = []
    tokens = 0
    experts: set[int] = set()
    for i in sorted((i for i in eligible if flights[i].layer == layer), key=lambda i: flights[i].lag):
        f = flights[i]
        union = experts | set(f.experts)
        if members and (tokens + len(f.tokens) > params.max_tokens or len(union) > params.max_experts):
            continue
        members.append(i)
        tokens += len(f.tokens)
        experts = union
    return Plan(Group(tuple(members), layer), waiting)


def admit_loads(flights: list[Flight], params: PolicyParams) -> list[int]:
    """Flights whose experts may be loaded (and held) now: those within load_window layers of
    the most lagging flight, lagging first, while the union of what they need fits the cache
    (so loads never evict each other in a loop)."""
    started = [i for i, f in enumerate(flights) if f.layer != FIRST]
    if not started:
        return []
    front = min(flights[i].depth(params.n_layer) for i in started)
    admitted: list[int] = []
    wanted: set[tuple[int, int]] = set()
    for i in sorted(started, key=lambda i: flights[i].lag):
        if flights[i].depth(params.n_layer) > front + params.load_window:
            break
        need = {(flights[i].layer, e) for e in flights[i].experts}
        if len(wanted | need) <= params.max_experts:
            wanted |= need
            admitted.append(i)
    return admitted
