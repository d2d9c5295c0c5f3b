"""The soak: `bevy-gguf serve` on loopback under a long seeded mix, and whether it stays the same.

A warm-up first (its requests are answered and checked, not measured), then the measured
requests; at the end of each the clients close their connections and the server is left idle,
and its resident memory, open descriptors and threads are read from /proc. Checks (docs/soak.md):
every answer right for its prompt (mix.check_answer), no error; RSS grown < 5% over the measured
requests, descriptors and threads as after the warm-up; the latency p50 of the last window of
requests within 10% of the first window's; /metrics idle and no expert slot pinned at the end.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bevy_gguf.errors import BevyError
from bevy_gguf.soak.mix import Job, Prompt, check_answer

RSS_GROWTH_MAX = 0.05
LATENCY_GROWTH_MAX = 0.10
IDLE_TIMEOUT_S = 60.0


@dataclass(slots=True)
class Outcome:
    job: int
    latency_s: float
    error: str | None = None  # what was wrong (None: the right answer)


@dataclass(slots=True)
class Snapshot:
    """The server process at an idle moment."""

    requests_done: int
    rss_kib: int
    fds: int
    threads: int
    metrics: dict[str, float] = field(default_factory=dict)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`bevy-gguf serve MODEL ARGS` on a free loopback port; its stderr goes to log_path."""

    def __init__(self, model: Path, args: list[str], log_path: Path, start_timeout_s: float = 300.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "bevy_gguf.cli", "serve", str(model), "--port",
                                      str(self.port), *args], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BevyError(f"the server exited at start (status {self.proc.returncode}): see {log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise BevyError(f"the server did not answer /health within {start_timeout_s:g} s: see {log_path}")

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {line.split()[0].removeprefix("bevy_"): float(line.split()[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def snapshot(self, done: int) -> Snapshot:
        """Wait until nothing runs or waits and the descriptor count has settled, then read /proc."""
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        last = -1
        while True:  # our own /metrics connection must be closed on the server's side before counting
            m = self.metrics()
            time.sleep(1.0)
            fds = self.fds()
            idle = m["requests_running"] == 0 and m["requests_queued"] == 0
            if (idle and fds == last) or time.monotonic() > deadline:
                break
            last = fds
        threads = len(os.listdir(f"/proc/{self.proc.pid}/task"))
        return Snapshot(done, self.rss_kib(), fds, threads, m)

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> int | None:
        """SIGTERM (a drain); the exit status."""
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        finally:
            self.log.close()


def run_job(http: httpx.Client, url: str, prompt: Prompt, job: Job) -> Outcome:
    """Send job, read its answer (or leave after cancel_after events), check it."""
    common = {"max_tokens": job.max_tokens, "temperature": 0, "stream": job.stream}
    if job.stop:
        common["stop"] = [job.stop]
    chat = prompt.kind == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = common | ({"messages": [{"role": "user", "content": prompt.text}]} if chat else {"prompt": prompt.text})
    t0 = time.perf_counter()
    try:
        if not job.stream:
            r = http.post(url + path, json=body)
            if r.status_code != 200:
                return Outcome(job.index, time.perf_counter() - t0, f"HTTP {r.status_code}: {r.text[:200]}")
            doc = r.json()
            choice = doc["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            error = check_answer(prompt, job, text, choice["finish_reason"], doc["usage"]["completion_tokens"])
            return Outcome(job.index, time.perf_counter() - t0, error)
        text, finish, events = "", None, 0
        with http.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                return Outcome(job.index, time.perf_counter() - t0, f"HTTP {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return Outcome(job.index, time.perf_counter() - t0, f"error event: {event['error']}")
                choice = event["choices"][0]
                text += (choice["delta"].get("content") or "") if chat else choice["text"]
                finish = choice.get("finish_reason") or finish
                events += 1
                if job.cancel_after and events >= job.cancel_after:
                    break  # leave mid-stream: the connection closes
        return Outcome(job.index, time.perf_counter() - t0, check_answer(prompt, job, text, finish))
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return Outcome(job.index, time.perf_counter() - t0, f"{type(e).__name__}: {e}")


def drive(server: ServerProcess, prompts: list[Prompt], jobs: list[Job], clients: int,
          progress: Any = None) -> list[Outcome]:
    """jobs over `clients` concurrent clients (one connection each, reopened after a cancel);
    outcomes in completion order. The clients' connections are closed at the end."""
    local = threading.local()
    made: list[httpx.Client] = []
    lock = threading.Lock()

    def one(job: Job) -> Outcome:
        if not hasattr(local, "http"):
            local.http = httpx.Client(timeout=600)
            with lock:
                made.append(local.http)
        out = run_job(local.http, server.url, prompts[job.prompt], job)
        if progress:
            progress(out)
        return out

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(one, job) for job in jobs]
        outcomes = [f.result() for f in concurrent.futures.as_completed(futures)]
    for http in made:
        http.close()
    return outcomes


def p50_ms(outcomes: list[Outcome], jobs: list[Job]) -> float | None:
    lat = [o.latency_s for o in outcomes if not jobs[o.job].cancel_after]
    return round(1e3 * statistics.median(lat), 2) if lat else None


def p50_by_window(measured: list[Outcome], jobs: list[Job], window: int) -> list[float | None]:
    """p50 latency (ms) of each consecutive window of measured requests, in completion order: a
    drift shows as a trend, sampling noise as scatter around a level."""
    return [p50_ms(measured[i: i + window], jobs) for i in range(0, len(measured) - window + 1, window)]


def summarize(before: Snapshot, after: Snapshot, measured: list[Outcome], all_outcomes: list[Outcome],
              jobs: list[Job], window: int, wall_s: float, exit_status: int | None,
              rss_curve: list[tuple[int, int]]) -> dict[str, Any]:
    """The soak's figures and its checks (each: value, limit, passed)."""
    errors = [o for o in all_outcomes if o.error]
    first, last = p50_ms(measured[:window], jobs), p50_ms(measured[-window:], jobs)
    rss_growth = after.rss_kib / before.rss_kib - 1
    checks = {
        "answers": {"value": len(errors), "limit": 0, "passed": not errors},
        "rss_growth": {"value": round(rss_growth, 4), "limit": RSS_GROWTH_MAX, "passed": rss_growth < RSS_GROWTH_MAX},
        "fds": {"value": [before.fds, after.fds], "passed": after.fds <= before.fds},
        "threads": {"value": [before.threads, after.threads], "passed": after.threads <= before.threads},
        "latency_p50_growth": {"value": round(last / first - 1, 4) if first and last else None,
                               "limit": LATENCY_GROWTH_MAX,
                               "passed": bool(first and last and last / first - 1 <= LATENCY_GROWTH_MAX)},
        "idle_metrics": {"value": {k: after.metrics.get(k) for k in ("requests_running", "requests_queued")},
                         "passed": after.metrics.get("requests_running") == 0
                         and after.metrics.get("requests_queued") == 0},
        "pinned_slots": {"value": after.metrics.get("expert_slots_pinned"),
                         "passed": after.metrics.get("expert_slots_pinned", 0) == 0},
        "exit_status": {"value": exit_status, "passed": exit_status == 0},
    }
    return {
        "requests": len(all_outcomes), "measured": len(measured), "wall_s": round(wall_s, 1),
        "requests_per_s": round(len(all_outcomes) / max(wall_s, 1e-9), 2),
        "errors": len(errors), "first_errors": [asdict(o) | {"request": asdict(jobs[o.job])} for o in errors[:10]],
        "cancelled": sum(1 for j in jobs if j.cancel_after),
        "latency_window": window, "latency_p50_first_ms": first, "latency_p50_last_ms": last,
        "latency_p50_ms_by_window": p50_by_window(measured, jobs, window),
        "after_warmup": asdict(before), "at_end": asdict(after), "rss_kib_by_requests": rss_curve,
        "checks": checks, "passed": all(c["passed"] for c in checks.values()),
    }
