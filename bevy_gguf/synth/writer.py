"""Writes a generated model as a GGUF that stock llama.cpp loads (qwen3moe, qwen2moe, mixtral,
glm4moe, gpt-oss, deepseek2, qwen35moe), streamed a chunk at a time; with --quantize, passed through stock
llama-quantize (the user's quantization mixes)."""

from __future__ import annotations

import math
import os
import struct
import subprocess
from pathlib import Path

import gguf
import numpy as np
from tqdm import tqdm

from bevy_gguf.errors import BevyError
from bevy_gguf.paths import tool_path
from bevy_gguf.synth.recipe import LINEAR_CONV_KERNEL
from bevy_gguf.synth.spec import FULL_ATTENTION_INTERVAL, IMATRIX_TYPES, ModelSpec
from bevy_gguf.synth.tensors import plan
from bevy_gguf.synth.tokenizer import build_vocab

CONTEXT_LENGTH = 4096
ROPE_FREQ_BASE = 10000.0
RMS_EPS = 1e-6
# tensor data keeps gguf's default alignment (32 bytes), as real files have it (convert_hf_to_gguf.py's
# and llama-quantize's output: llama-quantize would copy another general.alignment key but lay its
# output out with the default, misplacing every tensor), so an expert rarely starts a page and the
# cache's O_DIRECT reads of unaligned experts are the measured case (cache_layout.SlotClass.kind_stride)

# llama.cpp stores Mixtral as 'llama' with expert tensors
GGUF_ARCH = {"qwen3moe": "qwen3moe", "qwen2moe": "qwen2moe", "mixtral": "llama", "glm4moe": "glm4moe",
             "gpt-oss": "gpt-oss", "deepseek2": "deepseek2", "qwen35moe": "qwen35moe"}
SLIDING_WINDOW = 128  # gpt-oss's: every other layer attends to the last 128 positions
QTYPE = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0}
FILE_TYPE = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}

def _add_metadata(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    vocab = build_vocab(spec.n_vocab)
    w.add_name(f"bevy-gguf generated {spec.key}")
    w.add_file_type(FILE_TYPE[spec.dtype])
    w.add_block_count(spec.layers)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(spec.embd)
    w.add_feed_forward_length(spec.dense_width if spec.dense_layers else spec.ff)
    w.add_head_count(spec.n_head)
    if spec.arch == "deepseek2":
        _add_mla(w, spec)
    else:
        w.add_head_count_kv(spec.n_head_kv)
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        # GLM rotates half of each head (partial_rotary_factor 0.5), Qwen3.5 a quarter; the others all of it
        rotary = {"glm4moe": 2, "qwen35moe": 4}.get(spec.arch, 1)
        w.add_rope_dimension_count(spec.head_dim // rotary)
    w.add_rope_freq_base(ROPE_FREQ_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_expert_count(spec.experts)
    w.add_expert_used_count(spec.top_k)
    if spec.arch != "mixtral":
        w.add_expert_feed_forward_length(spec.ff)
    if spec.arch in ("qwen2moe", "qwen35moe"):
        w.add_expert_shared_feed_forward_length(spec.shared_width)
    if spec.arch == "qwen35moe":
        _add_linear_attention(w, spec)
    if spec.arch == "glm4moe":
        w.add_expert_shared_count(1 if spec.shared_width else 0)
        w.add_leading_dense_block_count(spec.dense_layers)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if spec.arch == "deepseek2":  # DeepSeek-V2-Lite's routing: softmax over every expert, top-k not renormalized
        w.add_expert_shared_count(spec.n_shared_experts)
        w.add_leading_dense_block_count(spec.dense_layers)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(False)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    if spec.arch == "gpt-oss":
        w.add_sliding_window(SLIDING_WINDOW)
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


def _add_mla(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    """deepseek2's attention keys as llama.cpp's converter writes them for MLA: the cache holds
    one compressed KV per token (a single KV head: kv_lora_rank values plus the rotated key
    part), and the *_mla lengths are a head's once decompressed. No query compression
    (q_lora_rank 0, as V2-Lite), written out: llama.cpp reads it for any depth but V2-Lite's."""
    rank, rope, hd = spec.kv_lora_rank, spec.rope_dim, spec.head_dim
    w.add_head_count_kv(1)
    w.add_key_length(rank + rope)
    w.add_value_length(rank)
    w.add_key_length_mla(hd + rope)
    w.add_value_length_mla(hd)
    w.add_rope_dimension_count(rope)
    w.add_q_lora_rank(0)
    w.add_kv_lora_rank(rank)


def _add_linear_attention(w: gguf.GGUFWriter, spec: ModelSpec) -> None:
    """qwen35moe's keys as llama.cpp's converter writes them: the gated delta net's shape (its
    recurrent state is linear_head_size x linear_head_size per value head), every
    FULL_ATTENTION_INTERVAL-th layer full attention, and the interleaved M-RoPE sections of the
    rotated quarter of a head (Qwen3.5's [11, 11, 10] for 64 rotated dimensions)."""
    w.add_ssm_conv_kernel(LINEAR_CONV_KERNEL)
    w.add_ssm_inner_size(spec.linear_value_dim)
    w.add_ssm_state_size(spec.linear_head_dim)
    w.add_ssm_time_step_rank(spec.n_linear_heads)
    w.add_ssm_group_count(spec.n_linear_key_heads)
    w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
    pairs = spec.head_dim // 4 // 2  # rotated dimension pairs, over three sections (time, height, width)
    third = pairs // 3
    w.add_rope_dimension_sections([third + (pairs % 3 > 0), third + (pairs % 3 > 1), third, 0])


def _qtype(spec: ModelSpec, keep_f32: bool) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType.F32 if keep_f32 else QTYPE[spec.dtype]


def _encode(data: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16)
    return gguf.quants.quantize(np.asarray(data, dtype=np.float32), qtype)


def write_model(spec: ModelSpec, out: Path, progress: bool = True) -> None:
    """Generate spec's model into out (atomically: a partial file never has the final name);
    a quantized spec is its base model, written to a scratch file, through llama-quantize."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        if spec.quantize:
            base = out.with_name(f".{out.name}.{os.getpid()}.base.tmp")
            try:
                _write_base(spec.base, base, progress)
                quantize(base, tmp, spec, n_threads=os.cpu_count() or 1)
            finally:
                base.unlink(missing_ok=True)
        else:
            _write_base(spec, tmp, progress)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)


# tensor types llama-quantize writes only with an importance matrix (its tensor_requires_imatrix)
IMATRIX_TENSOR_TYPES = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs")


def quantize(src: Path, dst: Path, spec: ModelSpec, n_threads: int) -> None:
    """Run stock llama-quantize on src (spec.quantize, spec.tensor_types); one line on failure."""
    cmd = [str(tool_path("llama-quantize"))]
    if spec.dtype != "f16":
        cmd.append("--allow-requantize")  # a Q8_0 base is already quantized
    imatrix = dst.with_name(dst.name + ".imatrix")
    if spec.quantize in IMATRIX_TYPES or any(tt.split("=")[-1].lower() in IMATRIX_TENSOR_TYPES
                                             for tt in spec.tensor_types):
        flat_imatrix(src, imatrix)
        cmd += ["--imatrix", str(imatrix)]
    for tt in spec.tensor_types:
        cmd += ["--tensor-type", tt]
    cmd += ["--override-kv", f"bevy.quantize=str:{spec.quantize}"]
    if spec.tensor_types:
        cmd += ["--override-kv", f"bevy.tensor_types=str:{','.join(spec.tensor_types)}"]
    cmd += [str(src), str(dst), spec.quantize, str(n_threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        imatrix.unlink(missing_ok=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        # its first complaint names the cause (an invalid type, a missing file); usage text follows
        why = next((ln for ln in lines if any(w in ln.lower() for w in ("invalid", "error", "failed"))),
                   f"exit status {proc.returncode}")
        raise BevyError(f"llama-quantize {spec.quantize} failed: {why}")


def flat_imatrix(src: Path, dst: Path) -> None:
    """An importance matrix of ones for every matrix of src, in llama.cpp's legacy imatrix format
    (entries: name, calls, values; a 3-d expert tensor has a row of values per expert): what
    llama-quantize needs for its IQ1/IQ2 types. Every column equally important is what quantizing
    without one means; fine for test models, whose weights are random."""
    entries = [(t.name, int(t.shape[0]) * (int(t.shape[2]) if len(t.shape) > 2 else 1))
               for t in gguf.GGUFReader(src).tensors if len(t.shape) >= 2 and t.name.endswith(".weight")]
    with open(dst, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, n in entries:
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", 1, n))
            f.write(np.ones(n, dtype="<f4").tobytes())


def _write_base(spec: ModelSpec, tmp: Path, progress: bool) -> None:
    """The generated model (F16/Q8_0 experts) into tmp: the header from the tensors' shapes, then
    each tensor drawn and written a chunk at a time."""
    tensors = plan(spec)
    w = gguf.GGUFWriter(tmp, GGUF_ARCH[spec.arch])
    _add_metadata(w, spec)
    sizes = []
    for t in tensors:
        qtype = _qtype(spec, t.keep_f32)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            dtype = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16
            shape, nbytes = t.shape, math.prod(t.shape) * np.dtype(dtype).itemsize
        else:
            dtype, shape = np.uint8, gguf.quants.quant_shape_to_byte_shape(t.shape, qtype)
            nbytes = math.prod(shape)
        w.add_tensor_info(t.name, shape, np.dtype(dtype), nbytes, raw_dtype=qtype)
        sizes.append(nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    with tqdm(total=sum(sizes), desc=f"make-model {spec.key}", unit="B", unit_scale=True,
              disable=not progress, leave=False) as bar:
        for t, nbytes in zip(tensors, sizes):
            qtype, written = _qtype(spec, t.keep_f32), 0
            for chunk in t.draw():
                data = _encode(chunk, qtype)
                fout.write(data.tobytes())
                written += data.nbytes
                bar.update(data.nbytes)
            if written != nbytes:
                raise AssertionError(f"{t.name}: wrote {written} bytes, planned {nbytes}")
            w.write_padding(fout, nbytes)
    w.close()
