"""`bevy-gguf bench`: every system on identical requests, side by side, in one invocation.

Protocol (docs/benchmark.md): teacher-forced text workload (or real generation), cold cache per run,
each run in its own process (stock runs on the stock libllama), systems interleaved across
repeats (each repeat's order rotated by one), medians reported with every repeat kept. Per cache
point the bound is the larger of
the compute time (the fastest decode measured with every expert in memory: stock-resident, or
any system at a 100% cache) and the link time of the Belady-optimal misses of the recorded
blocking order. Beside it, the online bound: the same with the misses of the live cache's own
eviction policy replayed on that order (what a cache that cannot see the future needs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bevy_gguf.bench.memcap import MemoryCap, evict_page_cache
from bevy_gguf.bench.served import SERVER_SYSTEMS
from bevy_gguf.bench.variants import base_of, parse_system
from bevy_gguf.bench.worker import BEVY_SYSTEMS, SYSTEMS
from bevy_gguf.config import DEFAULT_RUNAHEAD, EVERY_LAYER, LinkSpec, parse_cache_size, physical_cores
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.stats import hit_rate
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.workload.serving import DECODE_TOKENS, PROMPT_TOKENS, serve_range

WORKER_TIMEOUT_S = 900
TRACE_EVENTS = 2_000_000
ALL_SYSTEMS = SYSTEMS + SERVER_SYSTEMS  # in-process runs, then servers driven over HTTP (bench/served.py)
# runs that do not depend on the cache point (once per repeat), and those of stock's offload (a
# memory cap per cache point, the same at every link point)
ONCE = ("stock-resident", "llama-server")
OFFLOAD = {"stock-offload": "stock-resident", "llama-server-offload": "llama-server"}  # -> its cap's basis


@dataclass(slots=True)
class BenchConfig:
    model: Path
    parallel: int = 8
    requests: int = 8
    prompt_tokens: int = 16
    steps: int = 64
    threads: int = field(default_factory=physical_cores)
    link: str = "file"
    eviction: str = "next-use"
    repeats: int = 3
    systems: list[str] = field(default_factory=lambda: list(SYSTEMS))
    caches: list[str] = field(default_factory=lambda: ["25%"])
    links: list[str] = field(default_factory=list)  # a link sweep (default: link alone)
    workload: str = "text"  # text | generate: a burst of `requests`; serve: a closed-loop stream (workload/serving.py)
    seed: int = 0
    warmup: int = 0  # serve: requests finished before the measured window (0: --parallel)
    timeline: bool = True
    split_factor: float = 1.0  # bevy's
    lanes: int = 0  # bevy's (0: measured)
    two_pass: str = "auto"  # every bevy-gguf system's (see EngineConfig)
    runahead: str = DEFAULT_RUNAHEAD  # bevy's
    device: str | None = None  # bevy-gguf's systems: the expert cache on this ggml device (None: host memory)
    gpu_layers: int = 0  # every system's -ngl

    def __post_init__(self) -> None:
        for system in self.systems:
            parse_system(system, ALL_SYSTEMS, BEVY_SYSTEMS)
            if system in SERVER_SYSTEMS and self.workload != "serve":
                raise BevyError(f"{system} is a server driven with the serving stream: use it with --workload serve")
        if self.workload not in ("text", "generate", "serve"):
            raise BevyError(f"--workload {self.workload}: choose text, generate or serve")
        if self.workload == "serve" and self.requests < self.parallel + max(self.warmup, 1) + 1:
            raise BevyError(f"--workload serve measures between the warm-up and the drain: it needs more than "
                            f"--parallel + the warm-up ({self.parallel} + {self.warmup or self.parallel}) "
                            f"requests; raise --requests")
        if self.repeats < 1:
            raise BevyError("--repeats must be at least 1")
        if not self.links:
            self.links = [self.link]
        for link in [self.link, *self.links]:
            LinkSpec.parse(link)

    def points(self, expert_bytes: int) -> list[tuple[str, float, str]]:
        """(cache, cache %, link) of every point of the sweep, caches outer."""
        return [(c, 100 * parse_cache_size(c, expert_bytes) / expert_bytes, link)
                for c in self.caches for link in self.links]


def _spec(cfg: BenchConfig, system: str, cache: str, link: str, trace_events: int = 0) -> dict[str, Any]:
    """The worker's spec of a system (or a variant: its base system with its options) at a point."""
    variant = parse_system(system, ALL_SYSTEMS, BEVY_SYSTEMS)
    return {"model": str(cfg.model), "system": variant.base, "cache": cache, "link": link, "parallel": cfg.parallel,
            "requests": cfg.requests, "threads": cfg.threads, "prompt_tokens": cfg.prompt_tokens, "steps": cfg.steps,
            "workload": cfg.workload, "seed": cfg.seed, "eviction": cfg.eviction, "trace_events": trace_events,
            "split_factor": cfg.split_factor, "lanes": cfg.lanes, "two_pass": cfg.two_pass,
            "runahead": cfg.runahead, "warmup": cfg.warmup or cfg.parallel, "device": cfg.device,
            "gpu_layers": cfg.gpu_layers,
            "prompt_range": serve_range(PROMPT_TOKENS, cfg.prompt_tokens),
            "decode_range": serve_range(DECODE_TOKENS, cfg.steps)} | variant.options


def run_worker(spec: dict[str, Any], cap: MemoryCap | None = None) -> dict[str, Any]:
    """One run in a fresh process (inside cap's cgroup if given: for a server system, the server
    process alone joins it, not the client driving it); its JSON, or an error row."""
    served = spec["system"] in SERVER_SYSTEMS
    if served and cap is not None:
        spec, cap = spec | {"cgroup": str(cap.path)}, None
    preexec = (lambda: cap.join(os.getpid())) if cap is not None else None
    module = "bevy_gguf.bench.served" if served else "bevy_gguf.bench.worker"
    try:
        proc = subprocess.run([sys.executable, "-m", module, json.dumps(spec)],
                              capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, preexec_fn=preexec)
    except subprocess.TimeoutExpired:
        return {"system": spec["system"], "error": f"timed out after {WORKER_TIMEOUT_S} s"}
    if proc.returncode != 0:
        if cap is not None and proc.returncode < 0:
            return {"system": spec["system"], "error": f"killed by the memory cap (signal {-proc.returncode})"}
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"system": spec["system"], "error": f"worker exited {proc.returncode}: {tail}"}
    return json.loads(proc.stdout)


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_row(system: str, cache_pct: float, runs: list[dict[str, Any]], link_point: str | None = None
                  ) -> dict[str, Any]:
    """Medians over the repeats of one system at one point of the sweep (a row of bench --json,
    docs/cli.md); link_point is the --link of the point (None: a stock system, which has none)."""
    ok = [r for r in runs if "error" not in r]
    row: dict[str, Any] = {"system": system, "cache": cache_pct, "link_point": link_point,
                           "repeats": [r.get("tok_per_s") for r in ok]}
    if not ok:
        row |= {"status": runs[0]["error"] if runs else "not run", "tok_per_s": None, "cache_bytes": None,
                "tpot_p50_ms": None, "tpot_p99_ms": None, "ttft_ms": None, "hit_rate": None, "bytes_loaded": None,
                "overlap_efficiency": None, "link_utilization": None, "link_bytes_per_s": None}
        return row
    tpot = [t for r in ok for t in r["tpot_ms"]]
    counters = [r.get("decode_counters") for r in ok if r.get("decode_counters")]
    overlap = [max(r["compute_busy_s"], r["link_busy_s"]) / r["decode_s"] for r in ok if r["decode_s"] > 0]
    link_util = [r["link_busy_s"] / r["decode_s"] for r in ok if r["decode_s"] > 0]
    # the rate the link reached while busy, apart from how long it was busy (link util): it rises
    # with the transfers a scheduler keeps in flight, and shows the disk's run-to-run spread
    busy_rates = [r["decode_counters"]["bytes_loaded"] / r["link_busy_s"] for r in ok
                  if r.get("decode_counters") and r["link_busy_s"] > 0]
    row |= {
        "status": "ok" if len(ok) == len(runs) else f"{len(runs) - len(ok)} of {len(runs)} runs failed",
        "tok_per_s": _median([r["tok_per_s"] for r in ok]),
        "cache_bytes": ok[0].get("cache_bytes"),
        "tpot_p50_ms": _percentile(tpot, 50), "tpot_p99_ms": _percentile(tpot, 99),
        "ttft_ms": _median([statistics.median(r["ttft_ms"]) for r in ok if r["ttft_ms"]]),
        "ttft_p99_ms": _percentile([t for r in ok for t in r["ttft_ms"]], 99),
        "ttft_by_request": [r.get("ttft_by_request") or {} for r in ok],  # per repeat: request index -> ms
        "window_s": _median([r["window"]["seconds"] for r in ok if r.get("window")]),
        "decode_tokens": _median([r["decode_tokens"] for r in ok if r.get("decode_tokens") is not None]),
        "hit_rate": _median([hit_rate(c) for c in counters]) if counters else None,
        "bytes_loaded": _median([c["bytes_loaded"] for c in counters]) if counters else None,
        # the whole run's (the same work in every system's run of a stream): bytes loaded <= blocking's
        "run_bytes_loaded": _median([r["run_bytes_loaded"] for r in ok if r.get("run_bytes_loaded") is not None]),
        "overlap_efficiency": _median(overlap), "link_utilization": _median(link_util),
        "link_bytes_per_s": _median(busy_rates) if busy_rates else None,
        "compute_busy_s": _median([r["compute_busy_s"] for r in ok]),
        # weighted by the share of the threads computing (lanes): the machine's compute spent
        "compute_used_s": _median([r.get("compute_used_s", r["compute_busy_s"]) for r in ok]),
        "link_busy_s": _median([r["link_busy_s"] for r in ok]), "decode_s": _median([r["decode_s"] for r in ok]),
        "stall_s": _median([c["stall_ns"] / 1e9 for c in counters]) if counters else None,
        "link_bounced": _median([c.get("link_bounced", 0) for c in counters]) if counters else None,
        "peak_rss_bytes": _median([r["peak_rss_bytes"] for r in ok]), "link": ok[0].get("link"),
        "micro_batch": ok[0].get("micro_batch"), "repacked_expert_tensors": ok[0].get("repacked_expert_tensors"),
        "expert_store": ok[0].get("expert_store"),
        "load_s": _median([r["load_s"] for r in ok if r.get("load_s")]),
        "cost_model": ok[-1].get("cost_model") or None,  # the last run's fit, per lane
        "lanes": [r.get("lanes") for r in ok] if ok[0].get("lanes") else None,
        "lane_seconds": ok[-1].get("lane_seconds") or None,
        "lane_layers": ok[-1].get("lane_layers"),
        "layer_calls": _median([r["layer_calls"] for r in ok if r.get("layer_calls") is not None]),
        "two_pass_calls": _median([r["two_pass_calls"] for r in ok if r.get("two_pass_calls") is not None]),
        "two_pass_overhead_s": _median([r["two_pass_overhead_s"] for r in ok
                                        if r.get("two_pass_overhead_s") is not None]),
        "load_contention_s": _median([r["load_contention_s"] for r in ok if r.get("load_contention_s") is not None]),
        "load_alone_s": _median([r["load_alone_s"] for r in ok if r.get("load_alone_s")]),
        "load_beside_s": _median([r["load_beside_s"] for r in ok if r.get("load_beside_s")]),
        "runahead": [r["runahead"] for r in ok if r.get("runahead")] or None,  # per run (runahead.py)
        "python_per_call_ms": _median([r["lane_time"]["python_per_call_ms"] for r in ok
                                       if (r.get("lane_time") or {}).get("python_per_call_ms") is not None]),
    }
    if counters and counters[0].get("prefetch_loads"):
        tp = sum(c["prefetch_hits"] for c in counters)
        row["prefetch_precision"] = tp / max(tp + sum(c["prefetch_wasted"] for c in counters), 1)
        row["prefetch_recall"] = tp / max(tp + sum(c["prefetch_missed"] for c in counters), 1)
    return row


def reference_order(cfg: BenchConfig) -> dict[str, Any]:
    """The routing of the workload (recorded in a patched process: teacher forcing makes it the
    same for every system) as warm-up + measured visits (bench/reference.py): a serving stream's
    through blocking's schedule, split at its steady-state window."""
    if cfg.workload == "serve":
        spec = {k: v for k, v in _spec(cfg, "blocking", "100%", cfg.link).items()
                if k in ("model", "requests", "prompt_range", "decode_range", "seed", "parallel", "threads", "warmup")}
        args = ["--serve", json.dumps(spec)]
    else:
        args = [str(cfg.model), str(cfg.requests), str(cfg.prompt_tokens), str(cfg.steps), str(cfg.threads)]
    proc = subprocess.run([sys.executable, "-m", "bevy_gguf.bench.reference", *args], capture_output=True, text=True,
                          timeout=WORKER_TIMEOUT_S)
    if proc.returncode != 0:
        raise BevyError(f"recording the reference routing failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def belady_misses(order: dict[str, Any], n_slots: int) -> int:
    from bevy_gguf.analysis.replay import belady_hits

    visits = [tuple(v) for v in order["prefill"]] + [tuple(v) for v in order["decode"]]
    decode_lookups = sum(len(e) for _, e in order["decode"])
    return decode_lookups - belady_hits(visits, n_slots, count_from=len(order["prefill"]))


def class_misses(order: dict[str, Any], layout: CacheLayout, budget_bytes: int,
                 count: Callable[[dict[str, Any], int], int]) -> tuple[int, int]:
    """(decode misses, their bytes) of the recorded order through a cache of budget_bytes in slot
    classes, as the live cache splits it: each class replayed on its own layers' visits with its
    own slots (count(order, n_slots): a policy's misses); one class: the order through every slot.
    A visit wider than its class's slots (a long prompt's layer through a small cache) is split
    as the live cache micro-batches it."""
    from bevy_gguf.analysis.replay import fit_visits

    misses = nbytes = 0
    for c, (sc, n_slots) in enumerate(zip(layout.classes, layout.class_slots(budget_bytes))):
        sub = {k: fit_visits([v for v in order[k] if layout.layer_class[v[0]] == c], n_slots)
               for k in ("prefill", "decode")}
        m = count(sub, n_slots)
        misses, nbytes = misses + m, nbytes + m * sc.bytes
    return misses, nbytes


def _bound_tok_per_s(decode_tokens: int, compute_s: float | None, link_s: float | None) -> float | None:
    """Decode tokens over the larger of the compute and link times; None without a compute time
    (no stock-resident run and no 100% point: a link time alone bounds nothing a system could reach)."""
    if not compute_s:
        return None
    return decode_tokens / max(compute_s, link_s or 0.0)


def policy_misses(order: dict[str, Any], n_slots: int, policy: str, n_layer: int, n_expert: int) -> int:
    """Decode misses of a libbevy eviction policy replayed on the recorded order (a replay is
    deterministic, its seed fixed: the prefill's misses are those of the prefill replayed alone)."""
    from bevy_gguf.analysis.replay import replay_policy

    prefill = [tuple(v) for v in order["prefill"]]
    visits = prefill + [tuple(v) for v in order["decode"]]

    def misses(vs: list) -> int:
        return sum(len(e) for _, e in vs) - (replay_policy(policy, vs, n_layer, n_expert, n_slots) if vs else 0)

    return misses(visits) - misses(prefill)


def touched_experts(order: dict[str, Any]) -> int:
    """Distinct (layer, expert) pairs the recorded order uses: a cache of at least that many
    slots sees cold misses only."""
    return len({(il, e) for il, es in order["prefill"] + order["decode"] for e in es})


def rotated(systems: list[str], repeat: int) -> list[str]:
    """The systems in the order of one repeat: each repeat starts one further along, so that
    every system runs in every place of the order (a run can leave the machine slower or faster
    for the next: a system always run after the heaviest one would be measured on a slower machine)."""
    k = repeat % len(systems) if systems else 0
    return systems[k:] + systems[:k]


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict[str, Any]:
    info = inspect_model(cfg.model)
    layout = CacheLayout.of(info)
    points = cfg.points(info.expert_bytes)
    caches = list(dict.fromkeys((c, pct) for c, pct, _ in points))
    others = [s for s in cfg.systems if s not in ONCE and s not in OFFLOAD]
    offloads = [s for s in OFFLOAD if s in cfg.systems]
    once = [s for s in ONCE if s in cfg.systems or any(OFFLOAD[o] == s for o in offloads)]
    plan = cfg.repeats * (len(once) + len(offloads) * (1 + len(caches)) + len(points) * len(others))
    bar = tqdm(total=plan, desc="bench", unit="run", disable=not progress)
    resident: dict[str, list[dict[str, Any]]] = {s: [] for s in once}
    unpacked: dict[str, list[dict[str, Any]]] = {s: [] for s in offloads}  # each offload cap's basis
    runs: dict[tuple[str, float, str | None], list[dict[str, Any]]] = {}
    timelines: dict[str, dict[str, Any]] = {}
    cap_notes: dict[tuple[str, float], str] = {}
    for repeat in range(cfg.repeats):
        for system in once:
            bar.set_postfix_str(f"{system}, repeat {repeat + 1}")
            resident[system].append(run_worker(_spec(cfg, system, "100%", cfg.link)))
            bar.update()
        for system in offloads:
            if not cfg.gpu_layers:  # the cap's basis: stock as the offload runs it, every weight mapped
                basis = OFFLOAD[system]
                bar.set_postfix_str(f"{basis} --no-repack (the offload cap), repeat {repeat + 1}")
                unpacked[system].append(run_worker(_spec(cfg, basis, "100%", cfg.link) | {"repack": False}))
                bar.update()
        for cache, pct in caches:
            for system in offloads:  # stock reads the file through mmap: the same at every link point
                bar.set_postfix_str(f"{system} at {cache}, repeat {repeat + 1}")
                runs.setdefault((system, pct, None), []).append(
                    _run_offload(cfg, info, system, pct, unpacked[system], cap_notes))
                bar.update()
            for link in (p[2] for p in points if p[0] == cache):
                for system in rotated(others, repeat):
                    bar.set_postfix_str(f"{system} at {cache}, {link}, repeat {repeat + 1}")
                    trace = TRACE_EVENTS if (cfg.timeline and repeat == 0 and (cache, link) == points[0][::2]
                                             and system in BEVY_SYSTEMS) else 0
                    result = run_worker(_spec(cfg, system, cache, link, trace)) | {"system": system}
                    if trace and "error" not in result:
                        timelines[system] = {"events": result.pop("events"), "request_times": result["request_times"]}
                    result.pop("events", None)
                    runs.setdefault((system, pct, link), []).append(result)
                    bar.update()
    bar.close()

    rows = [summarize_row(system, 100.0, resident[system]) for system in once if system in cfg.systems]
    for cache, pct in caches:
        for system in offloads:
            row = summarize_row(system, pct, runs[(system, pct, None)])
            if (system, pct) in cap_notes:
                row["memory_cap"] = cap_notes[(system, pct)]
            rows.append(row)
        for link in (p[2] for p in points if p[0] == cache):
            rows += [summarize_row(system, pct, runs[(system, pct, link)], link) for system in others]

    # the bound of each point
    serve = cfg.workload == "serve"
    order = reference_order(cfg)
    decode_tokens = order["decode_tokens"] if serve else cfg.requests * cfg.steps  # a stream's: its window's
    bound = [_point_bound(cfg, info, layout, order, cache, link, rows, resident.get("stock-resident", []),
                          decode_tokens)
             for cache, _, link in points]
    rate_against_bounds(rows, bound)
    protocol = asdict(cfg) | {"model": str(cfg.model), "model_bytes": info.file_bytes,
                              "expert_bytes": info.expert_bytes, "slot_bytes": layout.slot_bytes,
                              "decode_tokens": decode_tokens, "touched_experts": touched_experts(order),
                              "working_set": order.get("working_set"),
                              "n_experts": info.n_layer * info.n_expert,
                              "link_rate_bytes_per_s": bound[0]["link_rate_bytes_per_s"] if bound else None,
                              "machine": _machine()}
    return {"protocol": protocol, "runs": rows, "bound": bound, "timelines": timelines}


BOUND_PASSED = ("where a row reads above 100% of its bound, that system decoded faster than the bound's compute "
                "side, the fastest all-resident decode this run measured (stock-resident, or any system at a 100% "
                "cache point, whose runs vary too): that bound does not hold it, and its ratio there says nothing of "
                "headroom (a sweep without a 100% cache point has stock-resident's alone)")


def rate_against_bounds(rows: list[dict[str, Any]], bound: list[dict[str, Any]]) -> None:
    """Each row's tok/s over its point's bound (pct_of_bound; None without one), and a note on each
    bound that a row ran faster than (the report prints the note once)."""
    for row in rows:
        b = next((b for b in bound if b["cache"] == row["cache"] and b["link_point"] == row["link_point"]), None)
        ok = b and b["tok_per_s"] and row["tok_per_s"]
        row["pct_of_bound"] = row["tok_per_s"] / b["tok_per_s"] if ok else None
        if ok and row["pct_of_bound"] > 1.0:
            b["note"] = BOUND_PASSED


def _point_bound(cfg: BenchConfig, info: Any, layout: CacheLayout, order: dict[str, Any] | None, cache: str,
                 link: str, rows: list[dict[str, Any]], resident: list[dict[str, Any]], decode_tokens: int
                 ) -> dict[str, Any]:
    """The bound of one point (see the module's docstring). A serving stream's is of its window:
    the reference order's decode tokens in it, the fastest all-resident window rate, and the
    misses of the window's visits through a cache warmed by the visits before it."""
    pct = 100 * parse_cache_size(cache, info.expert_bytes) / info.expert_bytes
    link_rate = _link_rate(link, [r for r in rows if r.get("link_point") == link])
    out: dict[str, Any] = {"cache": pct, "link_point": link, "link_rate_bytes_per_s": link_rate, "tok_per_s": None,
                           "belady_misses": None, "belady_bytes": None, "compute_s": None, "link_s": None,
                           "online_policy": cfg.eviction, "online_misses": None, "online_link_s": None,
                           "online_tok_per_s": None}
    compute_s = fastest_compute_s(resident, rows, decode_tokens, by_rate=cfg.workload == "serve")
    budget = parse_cache_size(cache, layout.slot_memory)  # as the live cache resolves a percentage
    misses, belady_bytes = class_misses(order, layout, budget, belady_misses)
    online, online_bytes = class_misses(order, layout, budget, lambda o, n: policy_misses(
        o, n, cfg.eviction, info.n_layer, info.n_expert))
    link_s, online_link_s = ((b / link_rate if link_rate else None) for b in (belady_bytes, online_bytes))
    return out | {"tok_per_s": _bound_tok_per_s(decode_tokens, compute_s, link_s), "belady_misses": misses,
                  "belady_bytes": belady_bytes, "compute_s": compute_s, "link_s": link_s, "online_misses": online,
                  "online_link_s": online_link_s,
                  "online_tok_per_s": _bound_tok_per_s(decode_tokens, compute_s, online_link_s)}


def _run_offload(cfg: BenchConfig, info: Any, system: str, pct: float, unpacked: list[dict[str, Any]],
                 notes: dict[tuple[str, float], str]) -> dict[str, Any]:
    """stock-offload (or llama-server-offload, the same for stock's server): stock llama.cpp (mmap,
    --no-repack) in a memory cgroup capped at the peak RSS of stock with every weight in memory
    (also --no-repack: `unpacked`, the runs of its basis system) - expert bytes + the cache share
    of the expert bytes. Without repacking, because repacking copies the repackable weights
    (Q4_0, Q4_K, ... on AVX2) out of the mapping into memory of stock's own at load: the model
    is then resident whatever the cap (measured: Q4_0 at a 25% cap ran at 65% of resident speed,
    3.3x bevy), which is no offload, and a user whose model exceeds memory must pass -nr.
    With layers on a GPU (-ngl above 0), what users run instead: -ngl N -ot exps=CPU (--cpu-moe),
    the routed experts in host memory, computed on the CPU, no cap."""
    if cfg.gpu_layers:
        notes[(system, pct)] = f"-ngl {cfg.gpu_layers} -ot exps=CPU (--cpu-moe)"
        return run_worker(_spec(cfg, system, f"{pct}%", cfg.link) | {"n_cpu_moe": EVERY_LAYER})
    peaks = [r["peak_rss_bytes"] for r in unpacked if "error" not in r]
    if not peaks:
        return {"system": system, "error": f"unavailable: {OFFLOAD[system]} --no-repack did not run, so no cap"}
    limit = int(max(peaks) - info.expert_bytes + info.expert_bytes * pct / 100)
    cap = MemoryCap(limit)
    if not cap.available:
        return {"system": system, "error": f"unavailable: {cap.reason}"}
    notes[(system, pct)] = f"cgroup v{cap.version} memory cap {limit / 2**20:.1f} MiB, --no-repack"
    try:
        evict_page_cache(cfg.model)
        return run_worker(_spec(cfg, system, f"{pct}%", cfg.link) | {"repack": False}, cap=cap)
    finally:
        cap.close()


def fastest_compute_s(resident: list[dict[str, Any]], rows: list[dict[str, Any]], tokens: int,
                      by_rate: bool = False) -> float | None:
    """Decode seconds of the fastest all-resident execution measured in this run: stock-resident,
    or any in-process system at a 100% cache (whose only loads are the compulsory ones). by_rate (a
    serving window, whose tokens differ by run): tokens at the median window rate of stock-resident."""
    if by_rate:
        rates = [r["tok_per_s"] for r in resident if "error" not in r and r.get("tok_per_s")]
        candidates = [tokens / _median(rates)] if rates else []
    else:
        times = [r["decode_s"] for r in resident if "error" not in r]
        candidates = [_median(times)] if times else []
    # the servers' rows are left out: over HTTP nothing is teacher-forced, and stock's server keeps a
    # KV stream per sequence, which layer-range decode cannot (the bound is of this engine's compute)
    candidates += [tokens / r["tok_per_s"] for r in rows
                   if r["cache"] == 100.0 and r.get("tok_per_s") and r["system"] not in SERVER_SYSTEMS]
    return min(candidates) if candidates else None


def _link_rate(link: str, rows: list[dict[str, Any]]) -> float | None:
    """Bytes/s of a link: the throttle's rate, else measured (the best bytes / link busy of
    the rows run over it)."""
    spec = LinkSpec.parse(link)
    if spec.rate:
        return spec.rate
    rates = [r["bytes_loaded"] / r["link_busy_s"] for r in rows
             if base_of(r["system"]) in BEVY_SYSTEMS and r.get("bytes_loaded") and r.get("link_busy_s")]
    return max(rates) if rates else None


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Linux {os.uname().release}"
