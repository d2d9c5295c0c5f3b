"""On a CUDA build only (`make build CUDA=1`; scripts/gpu_check.sh runs these): with every layer on
the GPU, blocking over an unsplit cache on CUDA0 equals stock llama.cpp -ngl 99, with CUDA graphs
and without (GGML_CUDA_DISABLE_GRAPHS=1). Skipped, saying why, on a build without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROMPTS, ROOT, TIMEOUT_S, tiny_spec

from bevy_gguf.synth import ensure_model

N_TOKENS = 8


def _devices() -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "bevy_gguf.cli", "devices", "--json"], capture_output=True,
                          text=True, cwd=ROOT, timeout=TIMEOUT_S)
    if proc.returncode != 0:  # a broken install must not pass for a machine without CUDA
        raise RuntimeError(f"bevy-gguf devices failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


CUDA = next((d["name"] for d in _devices() if d["name"].upper().startswith("CUDA")), None)
pytestmark = pytest.mark.skipif(CUDA is None, reason="this build has no CUDA device (make build CUDA=1 on a "
                                                      "machine with a GPU; scripts/gpu_check.sh runs these)")


def _tokens(model: Path, env: dict[str, str], *args: str) -> list[list[int]]:
    prompts = [a for p in PROMPTS for a in ("-p", p)]
    proc = subprocess.run([sys.executable, "-m", "bevy_gguf.cli", "run", str(model), "-ngl", "99", "-fa", "off",
                           "-n", str(N_TOKENS), "--parallel", "8", *args, *prompts, "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [r["tokens"] for r in json.loads(proc.stdout)["requests"]]


@pytest.mark.parametrize("graphs", ["on", "off"])
def test_blocking_on_cuda_slots_equals_stock_ngl_99(graphs: str) -> None:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2, embd=256, ff=256), progress=False)
    env = dict(os.environ) | ({"GGML_CUDA_DISABLE_GRAPHS": "1"} if graphs == "off" else {})
    stock = _tokens(model, env, "--engine", "stock")
    blocking = _tokens(model, env, "--scheduler", "blocking", "--expert-cache", "100%", "--device", CUDA)
    assert blocking == stock
