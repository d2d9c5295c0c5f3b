"""Shared fixtures: tiny generated models and helpers that run bevy-gguf in a subprocess.

Each libllama (stock, patched) needs its own process, so tests that decode run a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bevy_gguf.engine.registry import LAYER_RANGE_ARCHS
from bevy_gguf.synth import ensure_model
from bevy_gguf.synth.spec import ARCHS, DENSE_LEAD_ARCHS, FULL_ATTENTION_INTERVAL, ModelSpec
from bevy_gguf.synth.writer import GGUF_ARCH

ROOT = Path(__file__).resolve().parent.parent
PROBES = ROOT / "tests" / "probes"  # scripts that run one scenario in a process of their own
TIMEOUT_S = 300


def tiny_spec(arch: str = "qwen3moe", dtype: str = "q8_0", **kw: int) -> ModelSpec:
    """A tiny model of arch; `layers` counts its MoE layers (glm4moe gets one dense leading layer
    on top, as GLM-4.5 has, so every dense-layer path is exercised)."""
    params = dict(layers=2, experts=8, top_k=2, embd=64, ff=64, seed=0) | kw
    if arch in DENSE_LEAD_ARCHS and "dense_layers" not in kw:
        params |= dict(dense_layers=1, layers=params["layers"] + 1)
    if arch == "qwen35moe":  # every 4th layer attends (the others are linear attention): at least one
        params["layers"] = max(params["layers"], FULL_ATTENTION_INTERVAL)
    return ModelSpec(arch=arch, dtype=dtype, **params)


def quant_spec(quantize: str, arch: str = "qwen3moe", tensor_types: tuple[str, ...] = (), **kw: int) -> ModelSpec:
    """A tiny model through stock llama-quantize: 256 wide (K-quant blocks are 256 values; a
    narrower tensor falls back to another type) and 4 layers (Q4_K_M gives layers 2 and 3 a
    Q6_K ffn_down, layers 0 and 1 a Q4_K one)."""
    params = dict(layers=4, experts=8, top_k=2, embd=256, ff=256, seed=0) | kw
    return ModelSpec(arch=arch, dtype="f16", quantize=quantize, tensor_types=tensor_types, **params)


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model(request: pytest.FixtureRequest) -> Path:
    """A tiny model of every generated architecture."""
    return ensure_model(tiny_spec(request.param), progress=False)


@pytest.fixture(scope="session")
def qwen3_tiny() -> Path:
    return ensure_model(tiny_spec("qwen3moe"), progress=False)


def run_cli(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `bevy-gguf ARGS` in a fresh process; fail the test with its stderr on error."""
    proc = subprocess.run(
        [sys.executable, "-m", "bevy_gguf.cli", *map(str, args)],
        input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    if check and proc.returncode != 0:
        pytest.fail(f"bevy-gguf {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def run_json(*args: str) -> dict:
    return json.loads(run_cli(*args, "--json").stdout)


def run_probe(*args: str, script: str = "decode_probe.py") -> dict:
    """Run tests/probes/SCRIPT (default decode_probe.py: a fixed decode schedule on one libllama); its JSON."""
    proc = subprocess.run(
        [sys.executable, str(PROBES / script), *map(str, args)],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def probe_logits(tmp_path: Path, lib: str, model: Path, hook: str = "none", *extra: str) -> tuple[dict, np.ndarray]:
    """(probe JSON, every output's logits) of tests/probes/decode_probe.py's fixed schedule."""
    out = tmp_path / f"{lib}-{hook}-{abs(hash(extra))}.npy"
    result = run_probe("--lib", lib, "--model", model, "--out", out, "--hook", hook, *extra)
    return result, np.load(out)


MARGIN = 0.05  # docs/correctness.md


def compare_by_margin_rule(ref: dict, other: dict) -> tuple[int, int]:
    """(positions compared, mismatches) of other's tokens against ref's under the margin rule (docs/correctness.md)."""
    compared = mismatches = 0
    for r, o in zip(ref["requests"], other["requests"]):
        for pos, (a, b) in enumerate(zip(r["tokens"], o["tokens"])):
            if r["margins"][pos] < MARGIN:
                break
            compared += 1
            if a != b:
                mismatches += 1
                break
    return compared, mismatches


PROMPTS = ["Hello", "def f(x):\n    return x", "Grüß Gott, wie geht es dir heute?", "1, 2, 3, 5, 8, 13, 21",
           "ab", "The quick brown fox jumps over the lazy dog near the river bank", "§¶•ªº", "x"]


@pytest.fixture(scope="session", params=ARCHS)
def runahead_model(request: pytest.FixtureRequest) -> Path:
    """64 experts in all: 25% = 16 slots = the minimum for 8 contexts at top-2."""
    return ensure_model(tiny_spec(request.param, layers=4, experts=16, top_k=2), progress=False)


# the generated archs whose builders have layer-range decode (what --scheduler bevy runs on; elsewhere bevy-ctx)
LAYER_RANGE_SPEC_ARCHS = tuple(a for a in ARCHS if GGUF_ARCH[a] in LAYER_RANGE_ARCHS)


@pytest.fixture(scope="session", params=LAYER_RANGE_SPEC_ARCHS)
def layer_range_model(request: pytest.FixtureRequest) -> Path:
    """runahead_model's shape, of every arch that --scheduler bevy runs as itself."""
    return ensure_model(tiny_spec(request.param, layers=4, experts=16, top_k=2), progress=False)


def probe(model: Path, scheduler: str, cache: str, parallel: int, tmp_path: Path, **spec: object) -> dict:
    """Run tests/probes/engine_probe.py: requests on the bevy engine in one process; its JSON."""
    spec_path = tmp_path / f"spec-{scheduler}-{cache}-{parallel}.json"
    spec_path.write_text(json.dumps(spec))
    out = subprocess.run([sys.executable, str(PROBES / "engine_probe.py"), str(model), scheduler, cache,
                          str(parallel), str(spec_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def stock_alone(model: Path, prompts: list[str], n: int) -> dict:
    """The reference (docs/correctness.md) for per-request schedulers: stock llama.cpp, one prompt at a time."""
    args = [a for p in prompts for a in ("-p", p)]
    return run_json("run", model, "--engine", "stock", "--parallel", "1", "-n", str(n), *args)
