"""Bad input: one clear line on stderr, non-zero exit, no traceback."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import run_cli


def dense_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def assert_one_line_error(proc, fragment: str) -> None:  # noqa: ANN001
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and fragment in lines[0], lines[0]


@pytest.fixture
def files(tmp_path: Path, qwen3_tiny: Path) -> dict[str, Path]:
    empty = tmp_path / "empty.gguf"
    empty.touch()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(qwen3_tiny.read_bytes()[: qwen3_tiny.stat().st_size // 2])
    text = tmp_path / "text.gguf"
    text.write_text("not a model\n")
    latin1 = tmp_path / "prompts.txt"
    latin1.write_bytes("caf\xe9\n".encode("latin-1"))
    return {"empty": empty, "truncated": truncated, "text": text, "latin1": latin1,
            "dense": dense_gguf(tmp_path / "dense.gguf"), "missing": tmp_path / "missing.gguf"}


@pytest.mark.parametrize("case,fragment", [
    ("missing", "does not exist"), ("empty", "is empty"), ("truncated", "truncated"),
    ("text", "not a GGUF"), ("dense", "no routed experts"),
])
def test_bad_model_file(files: dict[str, Path], case: str, fragment: str) -> None:
    assert_one_line_error(run_cli("run", files[case], "-p", "hi", check=False), fragment)
    assert_one_line_error(run_cli("trace", files[case], check=False), fragment)
    assert_one_line_error(run_cli("soak", files[case], "--requests", "10", check=False), fragment)


def test_prompt_file_not_utf8(files: dict[str, Path], qwen3_tiny: Path) -> None:
    assert_one_line_error(run_cli("run", qwen3_tiny, "--prompts", files["latin1"], check=False), "not UTF-8")


def test_no_prompts(qwen3_tiny: Path) -> None:
    assert_one_line_error(run_cli("run", qwen3_tiny, stdin="", check=False), "no prompts")


@pytest.mark.parametrize("args,fragment", [
    (["run", "M", "--parallel", "0", "-p", "x"], "--parallel must be at least 1"),
    (["run", "M", "--parallel", "two", "-p", "x"], "--parallel must be an integer"),
    (["make-model", "o.gguf", "--arch", "gpt2"], "invalid choice: 'gpt2'"),
    (["make-model", "o.gguf", "--embd", "100"], "--embd 100 must be a multiple of 32"),
])
def test_bad_arguments(args: list[str], fragment: str) -> None:
    assert_one_line_error(run_cli(*args, check=False), fragment)


def test_soak_warmup_beyond_the_requests(qwen3_tiny: Path) -> None:
    args = ["soak", qwen3_tiny, "--requests", "10", "--warmup", "20"]
    assert_one_line_error(run_cli(*args, check=False), "--warmup 20: give 0 to 8")
