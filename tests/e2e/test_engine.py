"""One engine behind every caller: llama.cpp's option spellings, settings that reach the runner,
help texts that say what the code does, and no second context behind bevy_gguf.Llama."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, run_json, tiny_spec

from bevy_gguf.cli import build_parser
from bevy_gguf.config import physical_cores
from bevy_gguf.synth import ensure_model


def in_process(code: str) -> dict:
    """Run code in a fresh process (it picks its own libllama); the JSON it prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_llama_cpp_spellings_mean_the_same_as_ours(qwen3_tiny: Path) -> None:
    ours = run_json("run", qwen3_tiny, "-p", "Hello", "-p", "abc", "--parallel", "2", "--max-tokens", "6",
                    "--threads", "1", "--scheduler", "blocking", "--expert-cache", "100%")
    llama = run_json("run", "-m", qwen3_tiny, "-p", "Hello", "-p", "abc", "-np", "2", "-n", "6", "-t", "1",
                     "-c", "64", "-fa", "auto", "--scheduler", "blocking", "--expert-cache", "100%")
    assert [r["tokens"] for r in llama["requests"]] == [r["tokens"] for r in ours["requests"]]
    def tokens(*extra: str) -> list[int]:
        return run_json("run", qwen3_tiny, "-p", "Hi", "--engine", "stock", "-n", "40", *extra)["requests"][0]["tokens"]

    free, c12, c13 = tokens(), tokens("-c", "12"), tokens("-c", "13")
    assert len(c12) < 12 and len(c13) == len(c12) + 1 and free[: len(c13)] == c13  # the context ends generation


def test_the_model_is_given_once(qwen3_tiny: Path) -> None:
    proc = run_cli("run", qwen3_tiny, "-m", qwen3_tiny, "-p", "x", check=False)
    assert proc.returncode == 2 and "give the model once" in proc.stderr
    proc = run_cli("run", "-p", "x", check=False)
    assert proc.returncode == 2 and "give the model once" in proc.stderr


def test_threads_default_to_the_physical_cores_and_help_is_true() -> None:
    parser = build_parser()
    for command in ("run", "serve", "bench", "trace"):
        args = parser.parse_args([command, "m.gguf"])
        assert args.threads == physical_cores(), command
    text = run_cli("run", "--help").stdout
    assert "DESIGN" not in text and "§" not in text
    assert "bevy: requests grouped per layer" in text and "bevy-ctx: a context per request" in text


def test_settings_reach_the_runner_of_every_scheduler(layer_range_model: Path) -> None:
    code = f"""
import json
from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
out = {{}}
for s in ("bevy", "bevy-ctx", "prefetch", "blocking"):
    with LLMEngine(EngineConfig(model={str(layer_range_model)!r}, scheduler=s, n_threads=3, wait_timeout_s=7.5,
                                flash_attn="off", n_parallel=2)) as engine:
        r = engine.make_runner()
        out[s] = [type(r).__name__, r.n_threads, getattr(r, "wait_timeout_s", None), r.flash_attn_type,
                  engine.cache.native is not None, r.two_pass]
    for two_pass in ("on", "off"):
        with LLMEngine(EngineConfig(model={str(layer_range_model)!r}, scheduler=s, two_pass=two_pass)) as engine:
            out[s].append(engine.make_runner().two_pass)
print(json.dumps(out))
"""
    got = in_process(code)
    assert got["bevy"] == ["SelfBalancingRunner", 3, 7.5, 0, True, True, True, False]
    assert got["bevy-ctx"][:2] == ["ContextRunner", 3] and got["bevy-ctx"][3] == 0
    assert got["blocking"][:2] == ["BatchedRunner", 3] and got["prefetch"][0] == "BatchedRunner"
    # two passes by default where runahead is ours; blocking and prefetch stall as llama.cpp does
    assert [got[s][-3:] for s in ("bevy-ctx", "prefetch", "blocking")] == [[True, True, False], [False, True, False],
                                                                           [False, True, False]]


def test_llama_makes_contexts_only_to_decode(qwen3_tiny: Path) -> None:
    code = f"""
import json
from bevy_gguf._native.loader import use_libllama
lib = use_libllama("patched")
made = []
real = lib.llama_init_from_model
lib.llama_init_from_model = lambda *a: made.append(1) or real(*a)
import bevy_gguf
with bevy_gguf.Llama({str(qwen3_tiny)!r}, n_parallel=2, expert_cache="100%", scheduler="blocking") as llm:
    at_start = len(made)
    llm.generate_many(["a", "b"], max_tokens=3, temperature=0)
    print(json.dumps({{"at_start": at_start, "after": len(made), "threads": llm.n_threads}}))
"""
    got = in_process(code)
    assert got["at_start"] == 0 and got["after"] == 1  # one batched context, made for the decode


@pytest.mark.parametrize("scheduler", ["blocking", "bevy-ctx", "bevy"])
def test_a_serving_engine_forgets_finished_requests_and_pins_nothing_idle(scheduler: str) -> None:
    """A server's runner keeps a request while it is in flight only (they piled up: ~6 KiB of RSS
    per request in the soak), and an idle one holds no slot (bevy kept its reservations: 8 slots
    pinned at the end of the soak)."""
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    code = f"""
import gc, json, time
from pathlib import Path

import pytest
from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import Request
cfg = EngineConfig(model=Path({str(model)!r}), scheduler={scheduler!r}, n_parallel=4, n_ctx=64,
                   expert_cache="25%")
with LLMEngine(cfg) as eng:
    eng.start(64)
    for i in range(40):
        p = "x" * (1 + i % 7)
        assert eng.add_request(Request(prompt=p, prompt_tokens=eng.model.tokenize(p), max_tokens=1 + i % 5))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until every request is answered (and forgotten)
        time.sleep(0.2)
        gc.collect()
        requests = [o for o in gc.get_objects() if isinstance(o, Request)]
        alive, unfinished = len(requests), sum(not r.finished for r in requests)
        del requests
        if unfinished == 0 and alive <= 4:
            break
    time.sleep(0.5)
    print(json.dumps({{"alive": alive, "unfinished": unfinished, "pinned": eng.cache.pinned()}}))
    eng.stop()
"""
    got = in_process(code)
    assert got["unfinished"] == 0
    assert got["alive"] <= 4  # at most the queue's last hand-over (n_parallel) is still referenced
    assert got["pinned"] == 0
