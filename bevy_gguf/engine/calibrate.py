"""How many lanes `bevy` runs, and what a second pass per MoE layer costs, measured on this
machine before it decodes.

One context on every thread reads each expert once per batch; k lanes (k contexts of n_seq / k
sequences, n_threads / k threads each, side by side) read the union of each lane's tokens'
experts, more bytes in all, but a small graph may not get faster with more threads, so on some
machines lanes decode faster and on others slower (measured: two lanes were 1.22x one context at
a 75% cache on one 2-core machine, and slower than blocking on another). So the runner times it:
the same batch of tokens through a whole step (every layer in one call; where the cache cannot
hold a step's experts, the leading layers whose experts it holds, resident_layers), as one
context of every thread and as k lanes
calling side by side, each after a warm-up call that loads the experts it reads, and takes the
one that puts the most tokens through per second (fewer lanes unless more are faster by a margin
that guards the noise).

Two passes per MoE layer (patch 0004) add graph nodes to every MoE layer, which cost time even
where nothing misses (measured on the default model: bevy at a 90% cache 0.91-0.98x blocking
with two passes, 1.03x without), and what they overlap is not free either: a load that moves
while a call computes takes CPU from it when the link copies through the CPU. time_step_costs
measures both, so the runner turns the second pass on only for calls whose expected stall it
would hide pays for them (plan.two_pass_pays).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
import time
from dataclasses import dataclass

import numpy as np

from bevy_gguf._native import llama_ext
from bevy_gguf._native.llama_handles import Context, ContextParams, Model
from bevy_gguf.engine.cache_layout import DENSE, PAGE
from bevy_gguf.engine.expert_cache import ExpertCache

REPEATS = 5        # timed runs per candidate (median) of the step costs
# the lane measurement: each lane calls on its own, and a count is timed by the tokens per second
# its lanes put through together (time_lanes). Timed instead by the fastest single call with the
# lanes starting together at a barrier, two lanes read 0.67-0.83 of one lane on one 2-core machine
# and 0.98-1.26 on another (AVX-512), which then ran one lane, yet two lanes served 1.01-1.16x one
# lane there (the serving stream at 25-90%): one lane leaves the machine idle while its step loop
# runs Python, which lanes overlap with each other's compute; by throughput that machine reads
# 0.83-0.97 (two lanes in 8 of 9 runs). The first lane runs at least LANE_REPEATS_MIN calls, at
# most LANE_REPEATS_MAX, and stops between them once LANE_BUDGET_S has passed
LANE_REPEATS_MIN, LANE_REPEATS_MAX = 5, 40
LANE_BUDGET_S = 1.0
# rounds that time every count in turn (choose_lanes): at least LANE_ROUNDS, and on until they
# have spanned LANE_SPAN_S (at most LANE_ROUNDS_MAX). A count's speed is its fastest round, so a
# hiccup of the machine must outlast the span to be read as a count's speed. Measured on a 2-core
# machine (the default model, a 90% cache, 40 calls of 3 ms a count a round): the first two rounds
# of a process read two lanes at 0.91x and 0.94x one lane's time, the ten after at 0.64-0.85x.
# Two rounds (0.5 s in all) inside such a spell read the counts at the margin (0.936 there, and
# 1.09 in a bench run at that point, which then ran one lane: 0.95x blocking, against 0.99-1.26x
# in the runs that chose two)
LANE_ROUNDS, LANE_ROUNDS_MAX = 2, 12
LANE_SPAN_S = 2.0
ALONE_MAX_S = 1.0  # the longest the link streams alone waiting for its first finished load
# more lanes must take at most this share of one lane's compute time: a guard for the noise of
# the measurement, not a price of their bytes. Lanes read more bytes (each the union of its own
# tokens' experts: two lanes 1.13x one context's at a 25% cache on the default model), but one
# lane computes while another waits for its loads, and the link moves more loads at once: on 2
# threads two lanes ran 1.25x, 1.22x and 1.22x one lane at 25%, 50% and 90% (one invocation, 3
# repeats each, README "A prompt first..."), their layer time 0.73-0.98 of one lane's across runs;
# at 0.85 the choice fell to one lane in about a third of the runs
MARGIN = 0.95
CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog; def f(x): return 2 * x + 1  # 3.14159"


def _tokens(model: Model, n: int) -> list[int]:
    """n tokens of a fixed text (repeated as needed): each decodes as a sequence of its own."""
    text = model.tokenize(CALIBRATION_TEXT, add_bos=False)
    return [text[i % len(text)] for i in range(n)]


def _layers(ctx: Context, tokens: list[int], n_layers: int) -> None:
    """Each token alone at position 0 of its own sequence, through the first n_layers layers in
    one call (and the lookahead's attention of the next)."""
    rows = [(tok, 0, seq, True) for seq, tok in enumerate(tokens)]
    ctx.decode_layers(rows, None, 0, 0, True, False)
    ctx.decode_layers(rows, [ctx.hidden(len(rows))], 0, n_layers, ctx.model.n_layer > n_layers, True)
    for seq in range(len(tokens)):
        ctx.seq_rm(seq)


def enough_lane_runs(n_timed: int, elapsed_s: float) -> bool:
    """Whether a lane count has been timed enough: LANE_REPEATS_MAX runs, or LANE_REPEATS_MIN once
    LANE_BUDGET_S has passed (a large model's calls are long)."""
    return n_timed >= LANE_REPEATS_MAX or (n_timed >= LANE_REPEATS_MIN and elapsed_s >= LANE_BUDGET_S)


def time_lanes(model: Model, cache: ExpertCache, params: ContextParams, lanes: int, n_seq: int,
               n_layers: int = 1, two_pass: bool = False) -> float:
    """Seconds per n_seq tokens through the first n_layers layers with `lanes` contexts side by
    side (their MoE layers in two passes if two_pass): n_seq over the tokens per second the lanes
    put through together, each lane calling on its own from a common start, as a run's lanes do
    (their calls interleave with their step loops' Python, which one lane leaves the machine idle
    for and several overlap with each other's compute). Each lane's rate is its calls over its own
    span (start to its last finished call), so a call cut off at the end costs nothing; the span
    lasts as enough_lane_runs asks of the first lane's calls."""
    tokens = _tokens(model, n_seq)
    shares = [tokens[i::lanes] for i in range(lanes)]
    contexts = []
    try:
        for i, share in enumerate(shares):
            threads = params.n_threads // lanes + (i < params.n_threads % lanes)
            cp = dataclasses.replace(params, n_ctx=max(64, 2 * len(share)), n_batch=max(len(share), 1),
                                     n_ubatch=max(len(share), 1), n_seq_max=len(share), n_threads=threads)
            ctx = Context(model, cp)
            contexts.append(ctx)
            cache.attach(ctx, two_pass=two_pass)
        cache.set_concurrency(lanes)
        # each lane on one thread throughout, as in a run (a new thread would start a new OpenMP
        # team: its start-up would be timed); the first call of each loads its experts, untimed
        spans: list[tuple[int, float] | None] = [None] * lanes  # per lane: calls, seconds
        errors: list[BaseException] = []
        barrier = threading.Barrier(lanes)
        done = threading.Event()  # set by the first lane once it has run enough

        def run(i: int, ctx: Context, share: list[int]) -> None:
            try:
                _layers(ctx, share, n_layers)
                barrier.wait()
                t0 = time.perf_counter()
                calls, last = 0, t0
                while not done.is_set():
                    _layers(ctx, share, n_layers)
                    calls, last = calls + 1, time.perf_counter()
                    if i == 0 and enough_lane_runs(calls, last - t0):
                        done.set()
                spans[i] = (calls, last - t0)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)
                done.set()
                barrier.abort()

        workers = [threading.Thread(target=run, args=(i, contexts[i], shares[i])) for i in range(1, lanes)]
        for w in workers:
            w.start()
        run(0, contexts[0], shares[0])  # the first lane on this thread
        for w in workers:
            w.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
        return seconds_per_batch(n_seq, [len(share) for share in shares], spans)
    finally:
        for ctx in contexts:
            ctx.close()
        cache.release_hooks()


def seconds_per_batch(n_seq: int, lane_tokens: list[int], spans: list[tuple[int, float] | None]) -> float:
    """n_seq over the tokens per second of lanes that ran side by side: lane i put lane_tokens[i]
    tokens through each of its calls, spans[i] = (calls, seconds) (a lane that finished no call
    adds nothing); inf if none did."""
    rate = sum(tokens * span[0] / span[1] for tokens, span in zip(lane_tokens, spans)
               if span and span[0] and span[1] > 0)
    return n_seq / rate if rate > 0 else math.inf


def calibration_layers(cache: ExpertCache, n_seq: int) -> int:
    """Layers the calibration runs: every layer if the cache holds all their experts for n_seq
    tokens at once, else up to the first MoE layer if it holds that layer's twice over, else 0
    (it must not evict what it reads, nor fail for want of slots). With 0 the runner runs one lane
    unmeasured, and that guards the bytes too: lanes at different layers each load their own
    tokens' experts, and a cache that cannot hold two layers' worth evicts one lane's before the
    other comes to them (measured: the 6-layer mixtral shape, 64 experts a layer and 8 a token, at
    a 25% cache, 96 slots where 8 tokens read up to 64 a layer, serving stream: two lanes forced
    loaded 1.19x one lane's bytes at 1.04x its tok/s, 0.98-1.11 by repeat; 1.73x and 0.68x before
    the prompt permit, layers.PromptPermit; the calibration, which times calls with every expert
    in, cannot see either)."""
    layout = cache.layout
    per_layer = layout.min_slots(n_seq)
    if all(len(c.layers) * per_layer <= n for c, n in zip(layout.classes, cache.class_slots)):
        return layout.n_layer
    first = layout.moe_layers[0]
    return first + 1 if 2 * per_layer <= cache.class_slots[layout.layer_class[first]] else 0


def _batch_params(params: ContextParams, n_seq: int) -> ContextParams:
    """One context for n_seq tokens, each alone at position 0 of its own sequence, in one call."""
    return dataclasses.replace(params, n_ctx=max(64, 2 * n_seq), n_batch=n_seq, n_ubatch=n_seq)


def resident_layers(model: Model, cache: ExpertCache, params: ContextParams) -> int:
    """Layers the lane measurement times: calibration_layers' worst case, or more where the
    calibration's own tokens route to fewer experts than that: they run layer by layer through
    one context on every thread, each layer's experts loading while the slots its class has left
    hold that layer's worst case (so nothing the earlier layers loaded is evicted),
    and the count holds if those layers then run again loading nothing (else the worst case).

    Why the length matters: a call through one layer reads the same few tens of MB of experts
    over and over, which a large last-level cache keeps hot, and there lanes (each a few tokens on
    one thread) gain on one context where a whole step, which streams every layer's experts, does
    not. Measured on a 2-core Xeon (480 MiB L3, default model, every expert in): two lanes over one
    lane 0.82-0.89 through 1-2 layers, 0.88-0.91 through 3-4, 0.98-1.03 through 5-8; in the serving
    stream at 50% and 90% (the 1-layer measurement chose two lanes), one lane ran 1.00x two lanes'
    tok/s with 0.82x and 0.54x their TTFT p50."""
    layout, n_seq = cache.layout, params.n_seq_max
    base = calibration_layers(cache, n_seq)
    if base in (0, layout.n_layer):
        return base
    worst = layout.min_slots(n_seq)  # n_seq tokens' experts at a layer, at most
    used = [0] * len(cache.class_slots)
    tokens = _tokens(model, n_seq)
    rows = [(tok, 0, seq, True) for seq, tok in enumerate(tokens)]
    cp = _batch_params(params, n_seq)
    with Context(model, cp) as ctx:
        cache.attach(ctx, two_pass=False)
        cache.set_concurrency(1)
        try:
            ctx.decode_layers(rows, None, 0, 0, True, False)  # embeddings, layer 0's attention and router
            fit = 0
            for il in range(layout.n_layer):
                c = layout.layer_class[il]
                if c != DENSE and used[c] + worst > cache.class_slots[c]:
                    break
                hidden = [ctx.hidden(len(rows))]
                cache.begin(ctx, 0)
                ctx.decode_layers(rows, hidden, il, il + 1, il + 1 < layout.n_layer, True)
                pinned = cache.end(ctx)[0]  # the layer's distinct experts, resident or loaded
                if c != DENSE:
                    used[c] += pinned
                fit = il + 1
            if fit <= base:
                return base
            for seq in range(n_seq):
                ctx.seq_rm(seq)
            loads = cache.counters()["loads"]
            _layers(ctx, tokens, fit)
            stayed = cache.counters()["loads"] == loads
        finally:
            cache.release_hooks()
    return fit if stayed else base


def lane_candidates(most: int) -> list[int]:
    """The lane counts to time: 1, then doubling up to `most`, and `most` (on a 16-core machine
    with 8 sequences: 1, 2, 4, 8; a count between may beat both ends, and each lane's prompt
    calls get fewer threads the more lanes there are)."""
    counts = [1]
    while counts[-1] * 2 < most:
        counts.append(counts[-1] * 2)
    return counts + [most] if most > 1 else counts


def more_lane_rounds(rounds: int, elapsed_s: float) -> bool:
    """Whether choose_lanes times another round: fewer than LANE_ROUNDS so far, or fewer than
    LANE_ROUNDS_MAX while the rounds have spanned less than LANE_SPAN_S."""
    return rounds < LANE_ROUNDS or (rounds < LANE_ROUNDS_MAX and elapsed_s < LANE_SPAN_S)


def choose_lanes(model: Model, cache: ExpertCache, params: ContextParams,
                 candidates: list[int]) -> tuple[int, dict, int]:
    """The lane count to run (the first candidate unless a later one takes at most MARGIN of its
    time), the seconds each took, and the layers its calls ran (resident_layers): the fastest of
    the rounds that time every candidate in turn (more_lane_rounds), so that a hiccup of the
    machine lasting a candidate's whole measurement is not read as that candidate's speed."""
    n_seq = params.n_seq_max
    layers = max(1, resident_layers(model, cache, params))
    seconds: dict[int, float] = {}
    start, rounds = time.perf_counter(), 0
    while more_lane_rounds(rounds, time.perf_counter() - start):
        for k in candidates if rounds % 2 == 0 else candidates[::-1]:  # neither count always first
            seconds[k] = min(seconds.get(k, math.inf), time_lanes(model, cache, params, k, n_seq, layers))
        rounds += 1
    return pick_lanes(seconds, candidates, layers == cache.layout.n_layer), seconds, layers


def pick_lanes(seconds: dict[int, float], candidates: list[int], step_fits: bool) -> int:
    """The lane count a measurement reads: where a whole step's experts fit the cache (few loads
    to overlap), the first candidate unless a later one takes at most MARGIN of its time (fewer
    lanes read fewer bytes and give a prompt every thread); where they do not, the fastest, since
    loads will come and lanes overlap them with each other's compute, which the measurement (every
    expert in) cannot see. Measured on a 2-core Xeon, the 6-layer mixtral shape at 50% (four layers
    timed, two lanes 0.96x one lane's time): two lanes forced ran 1.06x (1.05-1.06) one lane's
    tok/s; the default model at 90% (every layer timed, 1.02x): 1.00x."""
    if not step_fits:
        return min(candidates, key=lambda k: (seconds[k], k))
    best = candidates[0]
    for k in candidates[1:]:
        if seconds[k] <= MARGIN * seconds[best]:
            best = k
    return best


@dataclass(frozen=True, slots=True)
class StepCosts:
    """What overlapping costs on this machine, measured with every expert in (see time_step_costs)."""

    pass_overhead_s: float  # seconds a second pass adds to a MoE layer
    load_contention_s: float  # compute seconds one expert load moving meanwhile adds to a call
    load_alone_s: float  # link seconds per expert load with nothing computing (its workers
                         # overlapping): what a load stalls a call that waits for it
    load_beside_s: float = 0.0  # ... while a call computes (reads started in the call count whole,
                                # so for calls shorter than a read it is a lower bound)


def time_step_costs(model: Model, cache: ExpertCache, params: ContextParams) -> StepCosts | None:
    """Time one context of params.n_seq_max tokens through the layers, interleaved repeat by
    repeat: in one pass, in two passes, and in one pass while the link moves experts at its own
    speed (its workers reading into scratch buffers). The second gives what the second pass's
    graph nodes cost per layer; the third what a load moving during a call costs the call: a
    link that copies through the CPU (a RAM or throttled link, bounce buffers) takes cores from
    the compute (measured on a 2-core machine: a 4 GB/s copy stream beside a step made it 1.8x
    slower), a DMA link next to nothing. Last, the link streams as long again with nothing
    computing: its time per load when a call waits for it (a link that copies through the CPU
    is slower beside the compute, so what it measures while overlapped overstates the stall a
    load causes). None when the cache cannot hold what it reads."""
    n_seq = params.n_seq_max
    layers = calibration_layers(cache, n_seq)
    if not layers:
        return None
    tokens = _tokens(model, n_seq)
    cp = _batch_params(params, n_seq)
    times: dict[str, list[float]] = {"one": [], "two": [], "loading": []}
    moved: list[float] = []  # expert loads per second of the "loading" runs
    alone: list[float] = []  # ... of the link streaming with nothing computing
    with Context(model, cp) as ctx, _LinkStream(cache) as stream:
        cache.attach(ctx, two_pass=False)
        cache.set_concurrency(1)
        try:
            _layers(ctx, tokens, layers)  # loads what it reads
            for _ in range(REPEATS):
                for kind in ("one", "two", "loading"):
                    llama_ext.set_two_pass(ctx.lib, ctx.ptr, kind == "two")
                    _layers(ctx, tokens, layers)  # a graph of the new kind is built here, not timed
                    if kind == "loading":
                        stream.start()
                    t = time.perf_counter()
                    _layers(ctx, tokens, layers)
                    times[kind].append(time.perf_counter() - t)
                    if kind == "loading":
                        moved.append(stream.stop() / times[kind][-1])
                alone.append(stream.alone(times["one"][-1]))  # nothing computing: the link's own speed
        finally:
            cache.release_hooks()
    # paired differences (runs next to each other in time, so that the machine's drift cancels)
    pairs = [b - a for a, b in zip(times["one"], times["two"])]
    second = statistics.median(pairs)
    if second <= 0:  # below the timer's noise, not free (it adds graph nodes): the upper quartile
        second = sorted(pairs)[len(pairs) * 3 // 4]  # bounds it (the largest pair may be a hiccup)
    beside = statistics.median((b - a) / (b * rate) if rate > 0 else 0.0
                               for a, b, rate in zip(times["one"], times["loading"], moved))
    rate, beside_rate = statistics.median(alone), statistics.median(moved)
    return StepCosts(pass_overhead_s=max(0.0, second / layers), load_contention_s=max(0.0, beside),
                     load_alone_s=1.0 / rate if rate > 0 else 0.0,
                     load_beside_s=1.0 / beside_rate if beside_rate > 0 else 0.0)


class _LinkStream:
    """The cache's link reading experts as fast as it goes, on as many threads as the cache has
    upload workers, into scratch buffers (no slot is touched); start() and stop() bracket what
    is counted, stop() returns once no read is under way, with the expert loads moved since start()."""

    def __init__(self, cache: ExpertCache) -> None:
        layout = cache.layout
        self.link = cache.native.link
        self.slot_bytes = layout.slot_bytes
        # as the upload workers read: with a page of room around the expert where they have it
        self.reads = [(offset + e * nbytes, nbytes, cache.reads_with_room(il, kind))
                      for (il, kind), offset in layout.sources.items()
                      for nbytes in (layout.layer_kind_bytes(il)[kind],) for e in range(layout.n_expert)]
        self._cv = threading.Condition()
        self._go = self._quit = False
        self._active = 0
        self._bytes = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(cache.n_workers)]
        self.error: BaseException | None = None

    def __enter__(self) -> _LinkStream:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._quit = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _run(self, index: int) -> None:
        reads = self.reads[index::len(self._threads)] or self.reads
        buffers = {n: _aligned(n + 2 * PAGE) for _, n, _ in reads}
        i = 0
        while True:
            with self._cv:
                while not (self._go or self._quit):
                    self._cv.wait()
                if self._quit:
                    return
                self._active += 1
            offset, nbytes, room = reads[i % len(reads)]
            at = offset % PAGE if room else 0
            i += 1
            try:
                self.link.read(offset, buffers[nbytes][at: at + nbytes], before=at, after=2 * PAGE - at if room else 0)
            except BaseException as e:  # noqa: BLE001 - a failed read: the measurement says nothing moved
                self.error = e
            with self._cv:
                self._active -= 1
                self._bytes += nbytes
                self._go = self._go and self.error is None
                self._cv.notify_all()

    def start(self) -> None:
        with self._cv:
            self._bytes = 0
            self._go = True
            self._cv.notify_all()

    def alone(self, seconds: float) -> float:
        """Expert loads per second of the link streaming for `seconds` with nothing else
        running; where no load finished in that window (a tiny model's step is shorter than a
        read), on until one has, over the time that took."""
        t0 = time.perf_counter()
        self.start()
        time.sleep(seconds)
        window = seconds
        deadline = t0 + ALONE_MAX_S
        with self._cv:
            while not self._bytes and self.error is None and time.perf_counter() < deadline:
                self._cv.wait(timeout=deadline - time.perf_counter())
                window = time.perf_counter() - t0
        return self.stop() / window

    def stop(self) -> float:
        with self._cv:
            self._go = False
            while self._active:
                self._cv.wait()
            return self._bytes / self.slot_bytes if self.error is None else 0.0


def _aligned(nbytes: int, alignment: int = 4096) -> np.ndarray:
    """nbytes of scratch starting at an `alignment` boundary (what O_DIRECT reads straight into)."""
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skip = -raw.ctypes.data % alignment
    return raw[skip: skip + nbytes]
