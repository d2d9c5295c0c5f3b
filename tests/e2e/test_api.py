"""bevy_gguf.Llama behaves like llama-cpp-python's Llama on the supported subset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PROBES, ROOT


def api_probe(which: str, model: Path) -> dict:
    out = subprocess.run([sys.executable, str(PROBES / "api_probe.py"), which, str(model)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_completions_match_llama_cpp_python(qwen3_tiny: Path) -> None:
    """Greedy, seeded sampling (temperature, top-k, top-p, min-p, penalties), stop strings,
    max_tokens: the same texts, finish reasons and usage as llama-cpp-python on stock llama.cpp."""
    ours, theirs = api_probe("bevy", qwen3_tiny), api_probe("llama_cpp", qwen3_tiny)
    assert ours["completions"] == theirs["completions"]
    assert ours["completions"][-1][1] == "stop"  # the stop string was hit
    assert ours["many"] == theirs["many"]
    stats = ours["stats"]
    assert stats["scheduler"] == "bevy" and 0 < stats["hit_rate"] <= 1 and stats["link"].startswith("file")


def test_errors_and_lifecycle(qwen3_tiny: Path) -> None:
    code = f"""
import bevy_gguf
from bevy_gguf import BevyError
with bevy_gguf.Llama({str(qwen3_tiny)!r}, n_parallel=2, expert_cache="100%") as llm:
    for bad in (dict(prompt="x", logprobs=3), dict(prompt="x", stream=True), dict(prompt="x" * 3000)):
        try:
            llm.create_completion(**bad)
            raise SystemExit("accepted " + repr(bad)[:40])
        except BevyError as e:
            print("refused:", e)
    assert llm.generate_many([]) == []
    assert llm.create_completion("", max_tokens=2, temperature=0)["usage"]["prompt_tokens"] == 1  # BOS, as llama_cpp
try:
    llm.create_completion("x")
    raise SystemExit("a closed Llama answered")
except BevyError as e:
    print("closed:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:] + out.stdout
    assert out.stdout.count("refused:") == 3 and "closed: this Llama is closed" in out.stdout
    assert "logprobs= is not supported" in out.stdout and "stream= is not supported" in out.stdout
    assert "shorten it or raise n_ctx" in out.stdout


@pytest.mark.parametrize("bad,fragment", [({"n_parallel": 0}, "n_parallel must be at least 1"),
                                          ({"scheduler": "magic"}, "unknown scheduler"),
                                          ({"expert_cache": "0%"}, "must lie in (0, 100]")])
def test_bad_constructor_arguments(qwen3_tiny: Path, bad: dict, fragment: str) -> None:
    code = f"import bevy_gguf\nbevy_gguf.Llama({str(qwen3_tiny)!r}, **{bad!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and fragment in out.stderr
