"""make-model: real GGUFs that stock llama.cpp loads, deterministic by seed, cached."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import pytest
from conftest import quant_spec, run_cli, run_json, run_probe, tiny_spec

from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model
from bevy_gguf.synth import ensure_model, recipe, tensors
from bevy_gguf.synth.presets import PRESETS, preset_spec
from bevy_gguf.synth.spec import DENSE_LEAD_ARCHS, ModelSpec
from bevy_gguf.synth.tensors import n_params
from bevy_gguf.synth.tokenizer import N_VOCAB
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


@pytest.mark.parametrize("arch,gguf_arch", [("qwen3moe", "qwen3moe"), ("qwen2moe", "qwen2moe"), ("mixtral", "llama"),
                                            ("glm4moe", "glm4moe"), ("gpt-oss", "gpt-oss"), ("deepseek2", "deepseek2"),
                                            ("qwen35moe", "qwen35moe")])
def test_metadata_and_tensors(arch: str, gguf_arch: str) -> None:
    spec = tiny_spec(arch)
    path = ensure_model(spec, progress=False)
    info = inspect_model(path)
    assert (info.arch, info.n_layer, info.n_expert, info.n_expert_used) == (gguf_arch, spec.layers, 8, 2)
    assert info.n_embd == 64
    assert {t.kind for t in info.expert_tensors} == {"gate", "up", "down"}
    assert all(t.ggml_type == "Q8_0" and t.n_expert == 8 for t in info.expert_tensors)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    last = f"blk.{spec.layers - 1}"
    assert (f"{last}.ffn_up_shexp.weight" in names) == (arch in ("qwen2moe", "glm4moe", "deepseek2", "qwen35moe"))
    assert (f"{last}.attn_q_norm.weight" in names) == (arch in ("qwen3moe", "qwen35moe"))
    # qwen35moe: linear attention (a gated delta net) in three of every four layers, full attention in the fourth
    linear = {f"blk.{il}.ssm_conv1d.weight" for il in range(spec.layers) if (il + 1) % 4}
    assert (linear <= names) == (arch == "qwen35moe") and f"{last}.ssm_conv1d.weight" not in names
    assert (f"{last}.attn_sinks.weight" in names) == (f"{last}.ffn_gate_exps.bias" in names) == (arch == "gpt-oss")
    assert (f"{last}.exp_probs_b.bias" in names) == (arch == "glm4moe")
    # deepseek2: MLA, as llama.cpp's converter writes it (split K and V decompression, no query compression)
    mla = {f"{last}.attn_{t}.weight" for t in ("q", "kv_a_mqa", "kv_a_norm", "k_b", "v_b")}
    assert (mla <= names) == (arch == "deepseek2") != (f"{last}.attn_k.weight" in names)
    # glm4moe and deepseek2: a dense leading layer, as GLM-4.5 and DeepSeek-V2 have; the hook and the cache skip it
    assert info.moe_layers == list(range(spec.dense_layers, spec.layers))
    assert ("blk.0.ffn_gate.weight" in names) == (arch in DENSE_LEAD_ARCHS) != ("blk.0.ffn_gate_exps.weight" in names)


def test_parameter_count_is_stocks(tiny_model: Path) -> None:
    """n_params (what presets are held to) counts what stock llama.cpp loads."""
    reader = gguf.GGUFReader(tiny_model)
    field = {k: reader.fields[f"bevy.{k}"].contents() for k in ModelSpec.__dataclass_fields__
             if f"bevy.{k}" in reader.fields}
    spec = ModelSpec(**field)
    assert run_probe(tiny_model, script="params_probe.py") == {str(tiny_model): n_params(spec)}


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_have_the_published_parameter_count(name: str) -> None:
    preset = PRESETS[name]
    assert abs(n_params(preset.spec) / preset.published_params - 1) < 0.01


def test_a_shortened_preset_is_the_real_shape(tmp_path: Path) -> None:
    """--preset NAME --layers N: the real widths, N layers; stock llama.cpp loads and runs it."""
    spec = preset_spec("glm-4.5-air", 2, experts=8, vocab=0)
    assert (spec.embd, spec.ff, spec.n_head, spec.n_head_kv, spec.head_dim) == (4096, 1408, 96, 8, 128)
    assert (spec.layers, spec.dense_layers, spec.dense_ff) == (2, 1, 10944)
    small = preset_spec("gpt-oss-20b", 1, embd=256, ff=256, heads=8, kv_heads=2, vocab=1000)
    out = tmp_path / "gpt-oss.gguf"
    proc = run_cli("make-model", out, "--preset", "gpt-oss-20b", "--layers", "1", "--embd", "256", "--ff", "256",
                   "--heads", "8", "--kv-heads", "2", "--vocab", "1000")
    assert small.key in proc.stdout and f"{n_params(small) / 1e9:.3f} B parameters" in proc.stdout
    assert run_probe(out, script="params_probe.py") == {str(out): n_params(small)}
    doc = run_json("run", out, "-p", "Hello", "--engine", "stock", "--parallel", "1", "-n", "3")
    assert len(doc["requests"][0]["tokens"]) == 3


def test_deepseek_v2_lite_shortened_loads_in_stock(tmp_path: Path) -> None:
    """--preset deepseek-v2-lite: V2-Lite's MLA widths (a 512-wide compressed KV, heads of 128 +
    64 rotated), its two shared experts and dense first layer; narrowed, stock loads and runs it."""
    spec = preset_spec("deepseek-v2-lite", 3)
    assert (spec.kv_lora_rank, spec.head_dim, spec.rope_dim, spec.n_shared_experts) == (512, 128, 64, 2)
    out = tmp_path / "dsv2.gguf"
    args = ("--embd", "256", "--ff", "128", "--shared-ff", "256", "--dense-ff", "512", "--experts", "8",
            "--heads", "4", "--head-size", "64", "--kv-lora", "128", "--vocab", "1000")
    proc = run_cli("make-model", out, "--preset", "deepseek-v2-lite", "--layers", "3", *args)
    small = preset_spec("deepseek-v2-lite", 3, embd=256, ff=128, shared_ff=256, dense_ff=512, experts=8, heads=4,
                        head_size=64, kv_lora=128, vocab=1000)
    assert small.key in proc.stdout
    assert run_probe(out, script="params_probe.py") == {str(out): n_params(small)}
    doc = run_json("run", out, "-p", "Hello", "--engine", "stock", "--parallel", "1", "-n", "3")
    assert len(doc["requests"][0]["tokens"]) == 3


def test_written_a_chunk_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer streams each tensor in chunks (bounded memory at full depth): the bytes do not
    depend on the chunk size."""
    spec = tiny_spec("glm4moe", vocab=N_VOCAB + 100)
    whole, chunked = tmp_path / "whole.gguf", tmp_path / "chunked.gguf"
    write_model(spec, whole, progress=False)
    monkeypatch.setattr(recipe, "CHUNK_VALUES", 64 * 64)  # one expert, or 64 rows, per chunk
    monkeypatch.setattr(tensors, "CHUNK_VALUES", 64 * 64)
    write_model(spec, chunked, progress=False)
    assert sha(whole) == sha(chunked)


def test_tensor_data_has_the_alignment_of_real_files() -> None:
    """general.alignment 32, gguf's default and what convert_hf_to_gguf.py and llama-quantize
    write: expert tensors start where a real file's would, most of them inside a page (the
    cache's O_DIRECT reads must cope, see test_experts_of_whole_pages_load_without_a_copy)."""
    path = ensure_model(tiny_spec(), progress=False)
    assert gguf.GGUFReader(path).alignment == 32
    offsets = [t.offset for t in inspect_model(path).expert_tensors]
    assert all(o % 32 == 0 for o in offsets) and any(o % 4096 for o in offsets)


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
    ({"heads": 6, "kv_heads": 4}, "multiple of --kv-heads"), ({"head_size": 8}, "--head-size"),
    ({"shared_ff": 64}, "has no shared expert"), ({"dense_layers": 1}, "no dense leading layers"),
    ({"arch": "glm4moe", "dense_layers": 8}, "leaves no MoE layer"), ({"vocab": 10}, "--vocab"),
    ({"kv_lora": 64}, "no compressed KV"), ({"arch": "deepseek2", "kv_lora": 48}, "multiple of 32"),
    ({"arch": "deepseek2", "kv_heads": 2, "heads": 8}, "one compressed KV"),
    ({"arch": "deepseek2", "shared_ff": 96, "ff": 64}, "multiple of --ff"),
    ({"arch": "deepseek2", "head_size": 18, "heads": 16, "embd": 256}, "multiple of 4"),
    ({"linear_heads": 4}, "no linear-attention layers"), ({"arch": "qwen35moe", "linear_heads": 3}, "multiple of"),
    ({"arch": "qwen35moe", "linear_head_size": 10}, "--linear-head-size"),
    ({"arch": "qwen35moe", "head_size": 20, "heads": 8, "embd": 256}, "multiple of 8"),
])
def test_bad_spec(kw: dict, fragment: str) -> None:
    with pytest.raises(BevyError, match=fragment):
        ModelSpec(**kw)
