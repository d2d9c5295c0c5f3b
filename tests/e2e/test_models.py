"""make-model: real GGUFs that stock llama.cpp loads, deterministic by seed, cached."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import pytest
from conftest import quant_spec, run_cli, run_json, tiny_spec

from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model
from bevy_gguf.synth.spec import ModelSpec
from bevy_gguf.synth.writer import write_model


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    spec = tiny_spec()
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    write_model(spec, a, progress=False)
    write_model(spec, b, progress=False)
    write_model(tiny_spec(seed=1), c, progress=False)
    assert sha(a) == sha(b) != sha(c)


@pytest.mark.parametrize("arch,gguf_arch", [("qwen3moe", "qwen3moe"), ("qwen2moe", "qwen2moe"), ("mixtral", "llama")])
def test_metadata_and_tensors(arch: str, gguf_arch: str) -> None:
    path = ensure_model(tiny_spec(arch), progress=False)
    info = inspect_model(path)
    assert (info.arch, info.n_layer, info.n_expert, info.n_expert_used, info.n_embd) == (gguf_arch, 2, 8, 2, 64)
    assert {t.kind for t in info.expert_tensors} == {"gate", "up", "down"}
    assert all(t.ggml_type == "Q8_0" and t.n_expert == 8 for t in info.expert_tensors)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert ("blk.0.ffn_up_shexp.weight" in names) == (arch == "qwen2moe")
    assert ("blk.0.attn_q_norm.weight" in names) == (arch == "qwen3moe")


def test_tensor_data_starts_on_pages() -> None:
    """general.alignment 4096: expert ranges are page aligned, as O_DIRECT reads into slots need."""
    path = ensure_model(tiny_spec(), progress=False)
    reader = gguf.GGUFReader(path)
    assert reader.alignment == 4096
    assert all(t.data_offset % 4096 == 0 for t in reader.tensors)
    assert all(t.offset % 4096 == 0 for t in inspect_model(path).expert_tensors)


def test_stock_llama_cpp_runs_every_arch_and_dtype(tiny_model: Path) -> None:
    doc = run_json("run", tiny_model, "-p", "Hello", "--engine", "stock", "--parallel", "1", "-n", "4")
    assert len(doc["requests"][0]["tokens"]) == 4


def test_f16(tmp_path: Path) -> None:
    path = ensure_model(tiny_spec("mixtral", dtype="f16"), progress=False)
    assert {t.ggml_type for t in inspect_model(path).expert_tensors} == {"F16"}
    doc = run_json("run", path, "-p", "Hi", "--engine", "stock", "--parallel", "1", "-n", "3")
    assert len(doc["requests"][0]["tokens"]) == 3


def test_cached_by_parameters() -> None:
    spec = tiny_spec()
    path = ensure_model(spec, progress=False)
    mtime = path.stat().st_mtime_ns
    assert ensure_model(spec, progress=False) == path and path.stat().st_mtime_ns == mtime
    assert ensure_model(tiny_spec(seed=7), progress=False) != path


def test_make_model_cli_writes_out(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    proc = run_cli("make-model", out, "--arch", "qwen2moe", "--layers", "2", "--experts", "4", "--top-k", "2",
                   "--embd", "64", "--ff", "32", "--dtype", "q8_0", "--seed", "3")
    assert out.exists() and "qwen2moe-L2-E4-k2-D64-F32-q8_0-s3" in proc.stdout
    assert inspect_model(out).n_expert == 4


def expert_types(path: Path) -> dict[str, set[str]]:
    types: dict[str, set[str]] = {}
    for t in inspect_model(path).expert_tensors:
        types.setdefault(t.kind, set()).add(t.ggml_type)
    return types


def test_quantized_by_llama_quantize() -> None:
    """--quantize Q4_K_M: llama-quantize's own mix (ffn_down Q6_K in some layers, Q4_K in the
    others), the default alignment of real files, loadable by stock llama.cpp."""
    path = ensure_model(quant_spec("Q4_K_M"), progress=False)
    assert expert_types(path) == {"gate": {"Q4_K"}, "up": {"Q4_K"}, "down": {"Q4_K", "Q6_K"}}
    reader = gguf.GGUFReader(path)
    assert reader.alignment == 32
    assert bytes(reader.fields["bevy.quantize"].parts[-1]).decode() == "Q4_K_M"
    doc = run_json("run", path, "-p", "Hello", "--engine", "stock", "--parallel", "1", "-n", "4")
    assert len(doc["requests"][0]["tokens"]) == 4


def test_tensor_types_make_a_mix() -> None:
    path = ensure_model(quant_spec("Q4_0", arch="mixtral", tensor_types=("ffn_up_exps=q8_0",)), progress=False)
    assert expert_types(path) == {"gate": {"Q4_0"}, "up": {"Q8_0"}, "down": {"Q4_0"}}


def test_llama_quantize_failure_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("make-model", tmp_path / "m.gguf", "--layers", "2", "--experts", "4", "--top-k", "2",
                   "--embd", "256", "--ff", "256", "--quantize", "q4_k_m", "--tensor-type", "ffn_down_exps=zz",
                   check=False)
    assert proc.returncode != 0 and "invalid ggml_type 'zz'" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kw,fragment", [
    ({"quantize": "Q4_K_X"}, "unknown --quantize"), ({"quantize": "Q4_0", "tensor_types": ("down",)}, "NAME=TYPE"),
    ({"tensor_types": ("ffn_down_exps=q6_k",)}, "needs --quantize"),
    ({"arch": "gpt2"}, "unknown arch"), ({"dtype": "q4_0"}, "unknown dtype"), ({"top_k": 9, "experts": 8}, "--top-k"),
    ({"embd": 100}, "--embd"), ({"ff": 16}, "--ff"), ({"layers": 0}, "--layers"),
])
def test_bad_spec(kw: dict, fragment: str) -> None:
    with pytest.raises(BevyError, match=fragment):
        ModelSpec(**kw)
