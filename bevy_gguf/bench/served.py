"""Server rows of the bench: stock llama-server and bevy-gguf serve, measured end to end by one client.

usage: python -m bevy_gguf.bench.served '<spec json>'   (prints one JSON object, as bench/worker.py)

The serving stream (workload/serving.py) goes to a server on loopback, closed-loop: --parallel
clients, each sending the next request of the stream as soon as its last one is answered, every
request streamed, greedy, `ignore_eos` (llama-server's extension, which bevy-gguf serve takes too)
so that it decodes its stream length, and `timings_per_token`, so that each chunk says how many
tokens were generated so far (a chunk can carry several: text that is not yet whole UTF-8 is held
back by both servers). A chunk bringing k tokens after the one before spreads them evenly over the
gap. The figures are then those of an in-process serving row, counted inside the same steady-state
window (bench/window.py): decode tok/s, TPOT, TTFT (the request sent to its first chunk) and, for
bevy-gguf serve, the expert cache's counters from /metrics, sampled while the run goes.

Systems: `llama-server` (stock, every weight in memory as it loads them: mmap, repacked),
`llama-server-offload` (stock, mmap, --no-repack, the server process alone in the memory cgroup the
bench made for it: spec["cgroup"]), `bevy-server` (`bevy-gguf serve`, the bench's cache and link).
Generation is not teacher-forced over HTTP: each server decodes its own greedy tokens (stock's and
bevy-gguf's agree by the margin rule, tests/e2e/test_served.py), so their routings differ a little.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bevy_gguf.bench.window import (
    CounterSampler,
    steady_window,
    window_counters,
    window_outputs,
    window_ttft_by_request,
)
from bevy_gguf.errors import BevyError
from bevy_gguf.paths import tool_path

SERVER_SYSTEMS = ("llama-server", "llama-server-offload", "bevy-server")
STOCK_SERVERS = ("llama-server", "llama-server-offload")
START_TIMEOUT_S = 600.0
METRICS_EVERY_S = 0.25
# bevy-gguf serve's /metrics totals -> the expert cache's counter names (as bench/worker.py reports them)
METRIC_COUNTERS = {"expert_cache_hits_total": ("hits", 1), "expert_cache_misses_total": ("misses", 1),
                   "expert_bytes_loaded_total": ("bytes_loaded", 1),
                   "compute_busy_seconds_total": ("compute_busy_ns", 1e9),
                   "compute_used_seconds_total": ("compute_used_ns", 1e9),
                   "link_busy_seconds_total": ("link_busy_ns", 1e9),
                   "expert_stall_seconds_total": ("stall_ns", 1e9)}


@dataclass(frozen=True, slots=True)
class StreamRequest:
    prompt: str
    max_tokens: int  # the first is the prompt's output, the rest decode steps


@dataclass(slots=True)
class Answer:
    """What the client saw of one request."""

    sent: float | None = None  # perf_counter seconds
    times: list[float] = field(default_factory=list)  # one per generated token
    text: str = ""
    finish: str | None = None
    error: str | None = None


def per_request_ctx(requests: list[StreamRequest], prompt_tokens: int) -> int:
    """Context tokens a request needs at most: the longest prompt and output, with room for a
    tokenizer that splits the text a little differently (the prompts are sent as text)."""
    return prompt_tokens + max(r.max_tokens for r in requests) + 64


def server_command(spec: dict[str, Any], port: int, n_ctx: int) -> list[str]:
    """The server's command line for a system of SERVER_SYSTEMS."""
    system, model = spec["system"], spec["model"]
    common = ["--host", "127.0.0.1", "--port", str(port), "-t", str(spec["threads"])]
    if spec.get("flash_attn"):  # both servers' -fa (default: each one's own, auto)
        common += ["-fa", spec["flash_attn"]]
    if system in STOCK_SERVERS:
        argv = [str(tool_path("llama-server")), "-m", model, *common, "-np", str(spec["parallel"]),
                "-c", str(spec["parallel"] * n_ctx), "--no-webui"]
        if system == "llama-server-offload" or not spec.get("repack", True):
            argv.append("--no-repack")
        if spec.get("gpu_layers"):
            argv += ["-ngl", str(spec["gpu_layers"])]
        if spec.get("n_cpu_moe"):  # the routed experts in host memory (llama.cpp's --cpu-moe)
            argv.append("--cpu-moe")
        return argv
    if system != "bevy-server":
        raise BevyError(f"unknown server system {system!r}: choose from {', '.join(SERVER_SYSTEMS)}")
    argv = [sys.executable, "-m", "bevy_gguf.cli", "serve", model, *common, "--parallel", str(spec["parallel"]),
            "--ctx-size", str(n_ctx), "--expert-cache", spec["cache"], "--link", spec["link"],
            "--scheduler", "bevy", "--eviction", spec.get("eviction", "next-use"),
            "--max-queued", str(max(128, len(spec.get("stream", [])) + 1))]
    if spec.get("device"):
        argv += ["--device", spec["device"]]
    if spec.get("gpu_layers"):
        argv += ["-ngl", str(spec["gpu_layers"])]
    return argv


class Server:
    """A server process on a loopback port (a context manager); its output goes to log_path.
    cgroup: a memory cgroup directory the process joins before it loads anything."""

    def __init__(self, argv: list[str], port: int, log_path: Path, cgroup: str | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.argv, self.log_path, self.cgroup = argv, log_path, cgroup
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        join = (lambda: Path(self.cgroup, "cgroup.procs").write_text(str(os.getpid()))) if self.cgroup else None
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=join,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BevyError(f"{Path(self.argv[0]).name} exited at start (status {self.proc.returncode}): "
                                f"{self._log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise BevyError(f"the server did not answer /health within {START_TIMEOUT_S:g} s: see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def _log_tail(self) -> str:
        self.log.flush()
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1] if lines else "(no output)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def peak_rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def counters(self) -> dict[str, int]:
        """bevy-gguf serve's expert-cache totals from /metrics, under the cache's counter names."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("bevy_"):
                name, value = line.split()[:2]
                if name.removeprefix("bevy_") in METRIC_COUNTERS:
                    key, scale = METRIC_COUNTERS[name.removeprefix("bevy_")]
                    out[key] = round(float(value) * scale)
        return out


def spread(times: list[float], last: float, now: float, k: int) -> None:
    """k tokens that arrived in one chunk at `now`, the chunk before at `last`: evenly over the gap
    (the first chunk's tokens all at `now`: what came before it was the prompt)."""
    if not times:
        times.extend([now] * k)
        return
    times.extend(last + (now - last) * (j + 1) / k for j in range(k))


def send(http: httpx.Client, url: str, request: StreamRequest, answer: Answer) -> None:
    """One streamed completion; fills answer as its chunks arrive."""
    body = {"prompt": request.prompt, "max_tokens": request.max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "timings_per_token": True}
    answer.sent = last = time.perf_counter()
    try:
        # a connection per request: a kept-alive one that the server closes as the next request goes
        # out fails it unsent (seen with llama-server), and loopback connections cost microseconds
        with http.stream("POST", url + "/v1/completions", json=body, headers={"Connection": "close"}) as r:
            if r.status_code != 200:
                answer.error = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                return
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    answer.error = f"error event: {event['error']}"
                    return
                now = time.perf_counter()
                n = (event.get("timings") or {}).get("predicted_n", len(answer.times))
                if n > len(answer.times):
                    spread(answer.times, last, now, n - len(answer.times))
                    last = now
                for choice in event.get("choices") or []:
                    answer.text += choice.get("text") or ""
                    answer.finish = choice.get("finish_reason") or answer.finish
    except (httpx.HTTPError, ValueError) as e:
        answer.error = f"{type(e).__name__}: {e}"


def drive(url: str, requests: list[StreamRequest], clients: int) -> list[Answer]:
    """The stream closed-loop: `clients` threads, each taking the next request in stream order as
    soon as its last one is answered. Answers in stream order."""
    answers = [Answer() for _ in requests]
    lock = threading.Lock()
    next_index = [0]

    def client() -> None:
        with httpx.Client(timeout=httpx.Timeout(600, connect=30)) as http:
            while True:
                with lock:
                    i = next_index[0]
                    next_index[0] += 1
                if i >= len(requests):
                    return
                send(http, url, requests[i], answers[i])

    threads = [threading.Thread(target=client, name=f"bench-client-{c}") for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def measure(answers: list[Answer], n_parallel: int, warmup: int) -> dict[str, Any]:
    """The figures of a driven run inside its steady-state window (as bench/worker.in_window)."""
    failed = [a.error for a in answers if a.error]
    if failed:
        raise BevyError(f"{len(failed)} of {len(answers)} requests failed, the first: {failed[0]}")
    window = steady_window([a.times[-1] for a in answers if a.times], n_parallel, warmup)
    tokens, gaps = window_outputs([a.times for a in answers], window)
    ttft = window_ttft_by_request([a.sent for a in answers], [a.times[0] if a.times else None for a in answers],
                                  window)
    whole = sum(max(len(a.times) - 1, 0) for a in answers)
    span = max(a.times[-1] for a in answers if a.times) - min(a.sent for a in answers if a.sent)
    return {"window": {"seconds": window.seconds, "requests": len(answers), "warmup": warmup},
            "whole_run": {"decode_tokens": whole, "decode_s": span, "tok_per_s": whole / span if span else None},
            "decode_tokens": tokens, "decode_s": window.seconds, "tok_per_s": tokens / window.seconds,
            "tpot_ms": gaps, "ttft_ms": list(ttft.values()), "ttft_by_request": {str(i): v for i, v in ttft.items()},
            "_window": window}


def stream_of(spec: dict[str, Any]) -> list[StreamRequest]:
    """The bench's serving stream as text prompts: the same seed gives the same requests as the
    in-process rows' (their prompts detokenized; their decode lengths as max_tokens)."""
    from bevy_gguf._native.llama_handles import Model
    from bevy_gguf._native.loader import use_libllama
    from bevy_gguf.workload.serving import ServeShape, serving_requests

    shape = ServeShape(requests=spec["requests"], prompt_tokens=tuple(spec["prompt_range"]),
                       decode_tokens=tuple(spec["decode_range"]), seed=spec.get("seed", 0))
    with Model(use_libllama("stock"), Path(spec["model"]), vocab_only=True) as model:
        return [StreamRequest(r.prompt, r.max_tokens) for r in serving_requests(model, shape, forced=False)]


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from bevy_gguf.soak.driver import free_port

    requests = [StreamRequest(p, n) for p, n in spec["stream"]] if spec.get("stream") else stream_of(spec)
    n_ctx = per_request_ctx(requests, spec["prompt_range"][1])
    port = free_port()
    log = Path(spec.get("log") or f"/tmp/bevy-bench-{spec['system']}-{os.getpid()}.log")
    argv = server_command(spec, port, n_ctx)
    with Server(argv, port, log, spec.get("cgroup")) as server:
        bevy = spec["system"] == "bevy-server"
        sampler = CounterSampler(server.counters, METRICS_EVERY_S) if bevy else None
        t_load = time.perf_counter()
        if sampler:
            with sampler:
                answers = drive(server.url, requests, spec["parallel"])
        else:
            answers = drive(server.url, requests, spec["parallel"])
        if not server.alive():
            raise BevyError(f"{Path(argv[0]).name} exited during the run: see {log}")
        out = measure(answers, spec["parallel"], spec.get("warmup") or spec["parallel"])
        window = out.pop("_window")
        out |= {"system": spec["system"], "peak_rss_bytes": server.peak_rss_bytes(), "server": " ".join(argv[:1]),
                "answers": [a.text for a in answers] if spec.get("keep_answers") else None,
                "generated": [len(a.times) for a in answers],
                "finish_reasons": sorted({a.finish or "none" for a in answers}),
                "client_s": time.perf_counter() - t_load, "request_times": [a.times for a in answers]}
        if sampler is None:
            return out | {"compute_busy_s": window.seconds, "compute_used_s": window.seconds, "link_busy_s": 0.0}
        return out | window_counters(sampler, window)


if __name__ == "__main__":
    from bevy_gguf.bench.worker import main

    sys.exit(main(run))
