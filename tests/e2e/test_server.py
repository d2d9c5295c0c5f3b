"""`bevy-gguf serve` with the official openai client, on loopback (docs/correctness.md for outputs)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import MARGIN, ROOT, run_json, tiny_spec

from bevy_gguf.synth import ensure_model
from bevy_gguf.synth.tokenizer import BYTE_BASE, SPACE_TOKEN

PROMPTS = [f"request {i}: " + "abcdefgh"[i % 8] * (1 + i % 5) for i in range(16)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bevy_gguf.cli", "serve", str(model), "--port",
                                      str(self.port), *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the server did not come up in 120 s")

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def model() -> Path:
    return ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    s = Server(model, "--parallel", "4", "--expert-cache", "50%", "--ctx-size", "256")
    yield s
    s.stop()


def piece(token: int) -> bytes:
    if token == SPACE_TOKEN:
        return b" "
    return bytes([token - BYTE_BASE]) if BYTE_BASE <= token < BYTE_BASE + 256 else b""


@pytest.fixture(scope="module")
def reference(model: Path) -> dict[str, str]:
    """Each prompt's greedy text up to its first near-tie (margin < 0.05), from stock llama.cpp
    decoding it alone: a concurrent answer must start with it."""
    doc = run_json("run", model, "--engine", "stock", "--parallel", "1", "-n", "8",
                   *[a for p in PROMPTS for a in ("-p", p)])
    out = {}
    for prompt, r in zip(PROMPTS, doc["requests"]):
        n = next((i for i, m in enumerate(r["margins"]) if m < MARGIN), len(r["margins"]))
        out[prompt] = b"".join(piece(t) for t in r["tokens"][:n]).decode("utf-8", errors="ignore")
    return out


def complete(client: openai.OpenAI, prompt: str, **kw: object) -> str:
    return client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0, **kw).choices[0].text


def test_completion_chat_and_models(server: Server) -> None:
    c = server.client()
    r = c.completions.create(model="m", prompt="Hello", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == 6 and 1 <= r.usage.completion_tokens <= 6
    chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi there"}], max_tokens=5,
                                     temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 5
    assert [m.id for m in c.models.list().data] == [Path(server.proc.args[4]).name]


def test_streaming_equals_the_whole_answer(server: Server) -> None:
    c = server.client()
    whole = complete(c, PROMPTS[3])
    chunks = list(c.completions.create(model="m", prompt=PROMPTS[3], max_tokens=8, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    chat = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                          temperature=0, stream=True))
    assert chat[0].choices[0].delta.role == "assistant" and chat[-1].choices[0].finish_reason is not None
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chat)
    whole_chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                           temperature=0).choices[0].message.content
    assert streamed == whole_chat


def test_stop_strings(server: Server) -> None:
    c = server.client()
    text = complete(c, PROMPTS[5])
    visible = [ch for ch in text[1:] if ch.strip()]
    if not visible:
        pytest.skip("the greedy text has nothing printable to stop at")
    stop = visible[0]
    r = c.completions.create(model="m", prompt=PROMPTS[5], max_tokens=8, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == text[: text.index(stop)]


def test_concurrent_answers_equal_single_ones(server: Server, reference: dict[str, str]) -> None:
    c = server.client()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: complete(c, p), PROMPTS))
    for prompt, answer in zip(PROMPTS, answers):
        assert answer.startswith(reference[prompt]), (prompt, answer, reference[prompt])


def test_load_64_clients(server: Server, reference: dict[str, str]) -> None:
    """64 concurrent clients, 320 requests: all complete, each the answer to its own prompt."""
    rng = random.Random(0)
    jobs = [rng.choice(PROMPTS) for _ in range(320)]
    c = server.client()

    def one(prompt: str) -> tuple[str, str, float]:
        t = time.perf_counter()
        return prompt, complete(c, prompt), time.perf_counter() - t

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, jobs))
    wall = time.perf_counter() - t0
    assert len(results) == len(jobs)
    for prompt, answer, _ in results:
        assert answer.startswith(reference[prompt])
    lat = sorted(r[2] for r in results)
    p99 = lat[int(0.99 * (len(lat) - 1))]
    report = {"requests": len(jobs), "concurrency": 64, "errors": 0, "wall_s": round(wall, 2),
              "p50_ms": round(1e3 * statistics.median(lat), 1), "p99_ms": round(1e3 * p99, 1)}
    print("load test:", json.dumps(report))
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_disconnect_frees_the_request(server: Server) -> None:
    with httpx.Client(timeout=30) as http, http.stream(
            "POST", server.url + "/v1/completions",
            json={"prompt": "long story", "max_tokens": 200, "temperature": 0, "stream": True}) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 2:
                break  # leave mid-stream
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = server.metrics()
        if m["bevy_requests_running"] == 0 and m["bevy_requests_queued"] == 0:
            break
        time.sleep(0.2)
    assert m["bevy_requests_running"] == 0 and m["bevy_requests_queued"] == 0
    assert complete(server.client(), "after") is not None  # the server still serves


def test_metrics_exposes_the_cache(server: Server) -> None:
    m = server.metrics()
    for key in ("bevy_requests_running", "bevy_requests_queued", "bevy_tokens_per_second",
                "bevy_expert_cache_hit_rate", "bevy_expert_bytes_loaded_total", "bevy_expert_stall_seconds_total",
                "bevy_link_utilization"):
        assert key in m
    assert m["bevy_expert_bytes_loaded_total"] > 0 and m["bevy_tokens_generated_total"] > 0


@pytest.mark.parametrize("body,fragment", [
    ('{"prompt": "x", "max_tokens": ', "not valid JSON"),
    ('{"prompt": "x", "temperature": "hot"}', "temperature"),
    ('{"prompt": "x", "max_tokens": 100000}', "beyond the context"),
    ('{"prompt": ""}', "prompt is empty"),
    ('{"max_tokens": 3}', "prompt"),
])
def test_bad_requests_get_400(server: Server, body: str, fragment: str) -> None:
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and fragment in err["message"]


def test_api_key(model: Path) -> None:
    s = Server(model, "--parallel", "2", "--expert-cache", "50%", "--api-key", "sekrit")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").completions.create(model="m", prompt="x", max_tokens=2)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert s.metrics()["bevy_tokens_generated_total"] == 0  # refused requests touched nothing
        assert complete(s.client("sekrit"), "x")
    finally:
        s.stop()


def test_full_queue_answers_503(model: Path) -> None:
    s = Server(model, "--parallel", "1", "--max-queued", "1", "--expert-cache", "50%")
    try:
        def one(_: int) -> httpx.Response:
            return httpx.post(s.url + "/v1/completions", json={"prompt": "busy", "max_tokens": 40}, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(one, range(12)))
        codes = [a.status_code for a in answers]
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        busy = next(a for a in answers if a.status_code == 503)
        assert busy.headers["retry-after"] == "1" and busy.json()["error"]["type"] == "server_error"
    finally:
        s.stop()


def slow_server(model: Path, *args: str) -> Server:
    """One request at a time through an emulated 1 MB/s link and a small cache: ~25 tokens/s on
    the tiny model, slow enough to signal the server while a request runs."""
    return Server(model, "--parallel", "1", "--max-queued", "4", "--ctx-size", "512", "--expert-cache", "25%",
                  "--link", "throttle:1MB/s:ram", *args)


def wait_for(what: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def refused(s: Server) -> bool:
    """A new connection is refused (while the socket is still open, /health answers 503)."""
    try:
        assert httpx.get(s.url + "/health", timeout=5).status_code == 503
    except httpx.ConnectError:
        return True
    except httpx.RemoteProtocolError:  # accepted as the socket closed, then closed unanswered: look again
        return False
    return False


def test_sigterm_drains_then_exits_0(model: Path) -> None:
    """SIGTERM: the running request finishes whole, the queued ones get 503, new connections are
    refused, and the process exits 0 (it died by the signal before)."""
    s = slow_server(model)
    body = {"prompt": "hello", "max_tokens": 100, "temperature": 0}
    whole = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]  # undisturbed
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(httpx.post, s.url + "/v1/completions", json=body, timeout=60)
        wait_for(lambda: s.metrics()["bevy_requests_running"] == 1)
        queued = [pool.submit(httpx.post, s.url + "/v1/completions", json=body, timeout=60) for _ in range(2)]
        wait_for(lambda: s.metrics()["bevy_requests_queued"] == 2)
        s.proc.send_signal(signal.SIGTERM)
        for q in queued:
            r = q.result()
            assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
            assert r.headers["retry-after"] == "1"
        wait_for(lambda: refused(s), timeout_s=2)  # the listening socket closes (uvicorn looks every 0.1 s)
        r = running.result()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0] == whole  # the same answer (alone on the server, greedy), whole
    assert s.proc.wait(30) == 0, s.proc.stderr.read()[-2000:]
    assert "draining" in s.proc.stderr.read()


def test_second_signal_exits_at_once(model: Path) -> None:
    s = slow_server(model, "--shutdown-grace", "120")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        body = {"prompt": "hello", "max_tokens": 400, "temperature": 0}  # ~16 s on this server
        long = pool.submit(httpx.post, s.url + "/v1/completions", json=body, timeout=60)
        wait_for(lambda: s.metrics()["bevy_requests_running"] == 1)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert s.proc.poll() is None  # draining: the request still runs
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(10) == 128 + signal.SIGINT
        assert time.monotonic() - t0 < 5
        with pytest.raises(httpx.HTTPError):
            long.result()


@pytest.mark.parametrize("body,status,fragment", [
    (b'{"prompt": "x", "pad": "' + b"y" * (17 * 2**20) + b'"}', 413, "the limit"),
    (b'{"prompt": "x", "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nests deeper"),
    (b'{"prompt": "x", "deep": ' + b"{\"a\": " * 40 + b"1" + b"}" * 40 + b"}", 400, "nests deeper"),
    (b'{"prompt": "\xff\xfe not UTF-8"}', 400, ""),
])
def test_hostile_bodies_get_4xx(server: Server, body: bytes, status: int, fragment: str) -> None:
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == status, r.text[:300]
    assert fragment in r.json()["error"]["message"]


def test_chunked_body_over_the_limit_gets_413(server: Server) -> None:
    """No Content-Length to refuse by: the limit applies to the bytes as they arrive."""
    def chunks() -> Iterator[bytes]:
        yield b'{"prompt": "x", "pad": "'
        for _ in range(17):
            yield b"y" * 2**20
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and "over" in r.json()["error"]["message"]


@pytest.mark.parametrize("headers", [
    {"x-big": "a" * 64 * 2**10},                      # one 64 KiB header
    {f"x-h{i}": "v" * 20 for i in range(2000)},        # 2,000 small ones (~56 KiB)
])
def test_oversized_request_heads_are_refused_and_the_server_stays(server: Server, headers: dict[str, str]) -> None:
    """More than 100 headers or 32 KiB of them: 431 with an error body (h11 alone let a head that
    arrives whole through at any size: these got 200); the server goes on serving."""
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers,
                   timeout=30)
    assert r.status_code == 431 and "headers" in r.json()["error"]["message"], r.text[:300]
    assert complete(server.client(), "after") is not None


def test_an_oversized_head_arriving_in_pieces_is_refused_too(server: Server) -> None:
    """A 64 KiB header sent in 4 KiB pieces reaches the same 431 (h11 buffers a head in pieces up
    to limits.BUFFERED_HEAD_BYTES; at its default 16 KiB the connection was closed mid-head, and
    the client got a reset or a broken pipe instead of an answer)."""
    body = b'{"prompt": "x", "max_tokens": 1}'
    data = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"x-big: " + b"a" * 64 * 2**10 + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as c:
        for i in range(0, len(data), 4096):
            c.sendall(data[i:i + 4096])
            time.sleep(0.002)
        assert c.recv(64).startswith(b"HTTP/1.1 431 ")
    assert complete(server.client(), "after") is not None


def test_brackets_inside_strings_are_not_nesting(server: Server) -> None:
    prompt = "[{" * 50 + "}]" * 50  # 200 brackets in a string: past the fast path, parsed as text
    r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("link,failure", [
    ("fault:error-every=400:ram", "I/O error (injected"),
    ("fault:short-every=400:ram", "short read"),
])
def test_failed_loads_fail_their_requests_only(model: Path, reference: dict[str, str], link: str,
                                               failure: str) -> None:
    """A load that fails never marks its slot ready: the requests of the call that needed it get
    an error naming the failure (500, or an error event when streaming), the others answer as
    they would without faults, and the server stays healthy with nothing left running."""
    s = Server(model, "--parallel", "2", "--expert-cache", "25%", "--ctx-size", "256", "--link", link)
    try:
        def one(prompt: str) -> httpx.Response:
            return httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                              timeout=60)

        # how many loads a round of prompts makes depends on the schedule (the cache's timing), so
        # rounds go on until one failed and one answered (each round checks every answer)
        statuses: set[int] = set()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(4):
                answers = list(pool.map(one, PROMPTS))
                for prompt, a in zip(PROMPTS, answers):
                    statuses.add(a.status_code)
                    if a.status_code == 200:
                        assert a.json()["choices"][0]["text"].startswith(reference[prompt]), prompt
                    else:
                        assert a.status_code == 500 and failure in a.json()["error"]["message"], a.text
                if statuses == {200, 500}:
                    break
        assert statuses == {200, 500}, statuses
        stream = httpx.post(s.url + "/v1/completions", timeout=60, json={
            "prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0, "stream": True})
        if stream.status_code == 200:  # an SSE stream to its end, with an error event if a load failed in it
            assert stream.text.endswith("data: [DONE]\n\n")
            errors = [json.loads(line[6:]) for line in stream.text.splitlines()
                      if line.startswith("data: {") and '"error"' in line]
            assert all(failure in e["error"]["message"] for e in errors), errors
        else:  # it failed before its first token: a status, as any request (app.first_event)
            assert stream.status_code == 500 and failure in stream.json()["error"]["message"], stream.text
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
        wait_for(lambda: s.metrics()["bevy_requests_running"] == 0)
    finally:
        s.stop()


def test_a_stalled_link_fails_the_waiting_requests_at_the_wait_timeout(model: Path) -> None:
    s = Server(model, "--parallel", "2", "--expert-cache", "25%", "--ctx-size", "256", "--wait-timeout", "1",
               "--link", "fault:stall-every=400,stall=3:ram")
    try:
        def one(prompt: str) -> tuple[int, str]:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                           timeout=60)
            return r.status_code, r.text

        codes: set[int] = set()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for _ in range(4):  # rounds until a stall came (its load count depends on the schedule)
                for code, text in pool.map(one, PROMPTS[:8]):
                    codes.add(code)
                    if code != 200:  # the hook's wait in a call, or the scheduler's with nothing to run
                        assert code == 500, text
                        assert "timed out after 1000 ms" in text or "timed out after 1 s" in text, text
                if codes == {200, 500}:
                    break
        assert codes == {200, 500}, codes
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()


def test_a_gguf_replaced_while_serving_keeps_serving_the_file_it_opened(model: Path, tmp_path: Path,
                                                                       reference: dict[str, str]) -> None:
    """A new file renamed over the GGUF (how models are updated): the server's mapping and its
    link keep the file they opened, so answers stay those of that model."""
    copy = tmp_path / "model.gguf"
    copy.write_bytes(model.read_bytes())
    s = Server(copy, "--parallel", "2", "--expert-cache", "25%", "--ctx-size", "256", "--link", "file")
    try:
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF" + bytes(1000))
        other.replace(copy)
        for prompt in PROMPTS[:4]:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                           timeout=60)
            assert r.status_code == 200 and r.json()["choices"][0]["text"].startswith(reference[prompt])
    finally:
        s.stop()


def test_a_gguf_cut_short_while_serving_unmapped_fails_only_the_loads_it_lacks(model: Path, tmp_path: Path,
                                                                               reference: dict[str, str]) -> None:
    """--load-mode none: the dense weights are read into memory at load, so a file truncated in place
    while serving (which kills a process that maps it) fails only the requests whose experts it no
    longer holds, each with a clear error; the others answer as before and the server stays up."""
    copy = tmp_path / "model.gguf"
    copy.write_bytes(model.read_bytes())
    s = Server(copy, "--parallel", "2", "--expert-cache", "25%", "--ctx-size", "256", "--link", "file",
               "--load-mode", "none")
    try:
        os.truncate(copy, copy.stat().st_size // 2)  # the experts of the later layers are gone
        statuses: set[int] = set()
        for prompt in PROMPTS:
            r = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                           timeout=60)
            statuses.add(r.status_code)
            if r.status_code == 200:
                assert r.json()["choices"][0]["text"].startswith(reference[prompt]), prompt
            else:
                assert r.status_code == 500 and "short read" in r.json()["error"]["message"], r.text
        assert 500 in statuses, statuses
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_idle_and_slow_connections_are_closed_and_do_not_starve_requests(model: Path) -> None:
    """500 connections that send nothing and one whose request head never ends: a real request
    is answered meanwhile, and after --head-timeout the server has closed them all (uvicorn alone
    held them for ever: a few thousand take every descriptor)."""
    s = Server(model, "--parallel", "2", "--expert-cache", "100%", "--ctx-size", "64", "--head-timeout", "3")
    socks: list[socket.socket] = []
    try:
        socks = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(500)]
        slow = socket.create_connection(("127.0.0.1", s.port))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        socks.append(slow)
        wait_for(lambda: len(os.listdir(f"/proc/{s.proc.pid}/fd")) > 400, 10)
        assert complete(s.client(), "hello") is not None
        wait_for(lambda: len(os.listdir(f"/proc/{s.proc.pid}/fd")) < 100, 20)
        for sock in socks[:10] + [slow]:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the server
    finally:
        for sock in socks:
            sock.close()
        s.stop()
