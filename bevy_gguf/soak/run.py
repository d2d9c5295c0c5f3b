"""`bevy-gguf soak`: references from stock llama.cpp, the server under the mix, the report."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.soak.driver import ServerProcess, drive, summarize
from bevy_gguf.soak.mix import CANCEL_MAX_TOKENS, make_jobs, reference_prompts


def minimum_cache(model: Path) -> str:
    """The smallest --expert-cache the model's engine accepts, in bytes."""
    return str(CacheLayout.of(inspect_model(model)).min_bytes())


def run_soak(model: Path, requests: int, clients: int, serve_args: list[str], out_dir: Path, seed: int = 0,
             warmup: int | None = None, window: int = 1000, max_prompt_tokens: int = 1000, max_tokens: int = 24,
             n_prompts: int = 64, threads: int = 1) -> dict[str, Any]:
    """Soak `serve MODEL serve_args`; writes out_dir/soak.json and the server's log; the summary."""
    out_dir.mkdir(parents=True, exist_ok=True)
    warmup = min(requests // 10, 1000) if warmup is None else warmup
    if not 0 <= warmup <= requests - 2:
        raise BevyError(f"--warmup {warmup}: give 0 to {requests - 2} (fewer than --requests {requests}, "
                        "so that two measured requests compare)")
    window = max(1, min(window, (requests - warmup) // 2))
    t0 = time.perf_counter()
    prompts = reference_prompts(model, n_prompts * 3 // 4, n_prompts - n_prompts * 3 // 4, max_prompt_tokens,
                                max(max_tokens, CANCEL_MAX_TOKENS), seed, threads)
    print(f"bevy-gguf soak: {len(prompts)} prompts ({min(p.n_tokens for p in prompts)}-"
          f"{max(p.n_tokens for p in prompts)} tokens) answered by stock llama.cpp in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    jobs = make_jobs(prompts, requests, max_tokens, seed, cycle=window)  # every window the same mix
    ctx = str(max_prompt_tokens + CANCEL_MAX_TOKENS + 64)
    server = ServerProcess(model, ["--ctx-size", ctx, "-fa", "off", *serve_args], out_dir / "server.log")
    done = [0]
    rss_curve: list[tuple[int, int]] = []  # (requests done, RSS KiB) at every tenth, under load
    lock = threading.Lock()
    step = max(requests // 10, 1)

    def progress(outcome: Any) -> None:
        with lock:
            done[0] += 1
            if done[0] % step == 0:
                rss_curve.append((done[0], server.rss_kib()))
                print(f"bevy-gguf soak: {done[0]}/{requests} requests, server RSS {rss_curve[-1][1] / 1024:.1f} MiB",
                      file=sys.stderr, flush=True)

    exit_status = None
    try:
        start = time.perf_counter()
        warm = drive(server, prompts, jobs[:warmup], clients, progress)
        before = server.snapshot(warmup)
        measured = drive(server, prompts, jobs[warmup:], clients, progress)
        after = server.snapshot(requests)
        wall = time.perf_counter() - start
    finally:
        exit_status = server.stop()
    summary = {"model": str(model), "serve_args": serve_args, "clients": clients, "seed": seed,
               "warmup": warmup} | summarize(before, after, measured, warm + measured, jobs, window, wall,
                                             exit_status, rss_curve)
    (out_dir / "soak.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def print_summary(s: dict[str, Any]) -> None:
    a, b = s["after_warmup"], s["at_end"]
    print(f"soak: {s['requests']} requests ({s['cancelled']} cancelled mid-stream) over {s['clients']} clients in "
          f"{s['wall_s']} s ({s['requests_per_s']} req/s), {s['errors']} wrong or failed")
    print(f"  RSS {a['rss_kib'] / 1024:.1f} -> {b['rss_kib'] / 1024:.1f} MiB, fds {a['fds']} -> {b['fds']}, "
          f"threads {a['threads']} -> {b['threads']} (after the {s['warmup']} warm-up requests -> at the end)")
    print(f"  latency p50 of the first / last {s['latency_window']} measured: {s['latency_p50_first_ms']} / "
          f"{s['latency_p50_last_ms']} ms")
    for name, c in s["checks"].items():
        limit = f" (limit {c['limit']})" if "limit" in c else ""
        print(f"  {'ok  ' if c['passed'] else 'FAIL'} {name}: {c['value']}{limit}")
    for e in s["first_errors"]:
        print(f"  request {e['job']} ({e['request']}): {e['error']}")
