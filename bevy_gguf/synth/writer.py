"""Writes a generated model as a GGUF that stock llama.cpp loads: qwen3moe, qwen2moe, mixtral;
with --quantize, passed through stock llama-quantize (the user's quantization mixes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
from tqdm import tqdm

from bevy_gguf.errors import BevyError
from bevy_gguf.paths import tool_path
from bevy_gguf.synth.recipe import Recipe
from bevy_gguf.synth.spec import ModelSpec
from bevy_gguf.synth.tokenizer import build_vocab

CONTEXT_LENGTH = 4096
ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-6
# tensor data starts on 4 KiB pages, so O_DIRECT reads an expert straight into its cache slot
# (no bounce copy) whenever its size is whole pages, as for the default model; a model to
# quantize keeps gguf's default (32, what real files have): llama-quantize copies the
# general.alignment key but lays its output out with the default, misplacing every tensor
DATA_ALIGNMENT = 4096

# llama.cpp stores Mixtral as 'llama' with expert tensors
GGUF_ARCH = {"qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "mixtral": "llama"}
QTYPE = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPE = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}

Tensor = tuple[str, np.ndarray, bool]  # name, data, keep in f32


def _tensors(spec: ModelSpec, recipe: Recipe) -> Iterator[Tensor]:
    """Every tensor of the model in file order, drawn one layer at a time."""
    d = spec.embd
    ones = np.ones(d, dtype=np.float32)
    yield "token_embd.weight", recipe.token_embd(), False
    yield "output_norm.weight", ones, True
    yield "output.weight", recipe.output(), False
    for il in range(spec.layers):
        blk = f"blk.{il}"
        attn = recipe.attention(il)
        yield f"{blk}.attn_norm.weight", ones, True
        for name in ("q", "k", "v"):
            yield f"{blk}.attn_{name}.weight", attn[name], False
        yield f"{blk}.attn_output.weight", attn["o"], False
        if spec.arch == "qwen3moe":
            yield f"{blk}.attn_q_norm.weight", np.ones(spec.head_dim, dtype=np.float32), True
            yield f"{blk}.attn_k_norm.weight", np.ones(spec.head_dim, dtype=np.float32), True
        yield f"{blk}.ffn_norm.weight", ones, True
        yield f"{blk}.ffn_gate_inp.weight", recipe.router(il), True
        experts = recipe.experts(il)
        for name in ("gate", "up", "down"):
            yield f"{blk}.ffn_{name}_exps.weight", experts.pop(name), False
        if spec.arch == "qwen2moe":
            shexp = recipe.shared_expert(il)
            yield f"{blk}.ffn_gate_inp_shexp.weight", shexp["gate_inp"], True
            for name in ("gate", "up", "down"):
                yield f"{blk}.ffn_{name}_shexp.weight", shexp[name], False


def _add_metadata(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    vocab = build_vocab()
    w.add_name(f"bevy-gguf generated {spec.key}")
    w.add_file_type(FILE_TYPE[spec.dtype])
    w.add_block_count(spec.layers)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(spec.embd)
    w.add_feed_forward_length(spec.ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_rope_freq_base(ROPE_FREQ_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_expert_count(spec.experts)
    w.add_expert_used_count(spec.top_k)
    if spec.arch != "mixtral":
        w.add_expert_feed_forward_length(spec.ff)
    if spec.arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(spec.ff)
    w.add_vocab_size(len(vocab.tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab.tokens)
    w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_unk_token_id(vocab.unk)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    for key, value in spec.as_dict().items():
        if key in ("quantize", "tensor_types"):
            continue  # set by the quantize step (the base is not quantized)
        if isinstance(value, int):
            w.add_uint32(f"bevy.{key}", value)
        else:
            w.add_string(f"bevy.{key}", str(value))


def _encode(data: np.ndarray, dtype: str, keep_f32: bool) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    if keep_f32:
        return data.astype(np.float32), gguf.GGMLQuantizationType.F32
    qtype = QTYPE[dtype]
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), qtype
    return gguf.quants.quantize(data.astype(np.float32), qtype), qtype


def write_model(spec: ModelSpec, out: Path, progress: bool = True) -> None:
    """Generate spec's model into out (atomically: a partial file never has the final name);
    a quantized spec is its base model, written to a scratch file, through llama-quantize."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        if spec.quantize:
            base = out.with_name(f".{out.name}.{os.getpid()}.base.tmp")
            try:
                _write_base(spec.base, base, progress, alignment=None)
                quantize(base, tmp, spec, n_threads=os.cpu_count() or 1)
            finally:
                base.unlink(missing_ok=True)
        else:
            _write_base(spec, tmp, progress, alignment=DATA_ALIGNMENT)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


def quantize(src: Path, dst: Path, spec: ModelSpec, n_threads: int) -> None:
    """Run stock llama-quantize on src (spec.quantize, spec.tensor_types); one line on failure."""
    cmd = [str(tool_path("llama-quantize"))]
    if spec.dtype != "f16":
        cmd.append("--allow-requantize")  # a Q8_0 base is already quantized
    for tt in spec.tensor_types:
        cmd += ["--tensor-type", tt]
    cmd += ["--override-kv", f"bevy.quantize=str:{spec.quantize}"]
    if spec.tensor_types:
        cmd += ["--override-kv", f"bevy.tensor_types=str:{','.join(spec.tensor_types)}"]
    cmd += [str(src), str(dst), spec.quantize, str(n_threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        # its first complaint names the cause (an invalid type, a missing file); usage text follows
        why = next((ln for ln in lines if any(w in ln.lower() for w in ("invalid", "error", "failed"))),
                   f"exit status {proc.returncode}")
        raise BevyError(f"llama-quantize {spec.quantize} failed: {why}")


def _write_base(spec: ModelSpec, tmp: Path, progress: bool, alignment: int | None) -> None:
    """The generated model (F16/Q8_0 experts) into tmp (alignment None: gguf's default)."""
    recipe = Recipe(spec)
    w = gguf.GGUFWriter(tmp, GGUF_ARCH[spec.arch])
    if alignment is not None:
        w.add_custom_alignment(alignment)
    _add_metadata(w, spec)
    encoded: list[tuple[str, np.ndarray, gguf.GGMLQuantizationType]] = []
    for name, tensor, keep_f32 in tqdm(_tensors(spec, recipe), desc=f"make-model {spec.key}", unit="tensor",
                                       disable=not progress, leave=False):
        data, qtype = _encode(tensor, spec.dtype, keep_f32)
        encoded.append((name, data, qtype))
        w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, data, _ in encoded:
        w.write_tensor_data(data)
    w.close()
