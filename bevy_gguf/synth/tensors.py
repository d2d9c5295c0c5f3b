"""The tensors of a generated model, per arch: names and shapes first, data drawn on demand.

The writer lays out the file from the shapes alone and then draws each tensor in chunks along
its first axis, so a full-depth preset (tens of GB) is written with one chunk in memory. The
names and shapes are what stock llama.cpp's builder for the arch loads (src/models/*.cpp of the
pinned source); `n_params` is what llama.cpp reports for the file.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from bevy_gguf.synth.recipe import CHUNK_VALUES, LINEAR_CONV_KERNEL, Recipe
from bevy_gguf.synth.spec import ModelSpec

Draw = Callable[[], Iterator[np.ndarray]]


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: the last axis is ggml's ne0
    keep_f32: bool          # norms, routers, biases: F32 whatever the model's dtype
    draw: Draw              # the values, in chunks along the first axis


def _once(value: Callable[[], np.ndarray]) -> Draw:
    return lambda: iter((value(),))


def _fill(name: str, shape: tuple[int, ...], value: float = 0.0) -> PlannedTensor:
    return PlannedTensor(name, shape, True, _once(lambda: np.full(shape, value, dtype=np.float32)))


def _ffn(prefix: str, suffix: str, draws: Callable[[], Iterator[tuple[str, np.ndarray]]],
         shapes: dict[str, tuple[int, ...]], chunks: int) -> list[PlannedTensor]:
    """gate, up, down of one generator that yields (kind, chunk) in that order: each tensor's
    draw takes its `chunks` chunks from the generator the gate's draw started."""
    state: dict[str, Iterator[tuple[str, np.ndarray]]] = {}

    def draw(kind: str) -> Draw:
        def chunks_of() -> Iterator[np.ndarray]:
            if kind == "gate":
                state["gen"] = draws()
            for _ in range(chunks):
                got, w = next(state["gen"])
                assert got == kind, (got, kind)
                yield w
        return chunks_of

    return [PlannedTensor(f"{prefix}.ffn_{kind}{suffix}.weight", shapes[kind], False, draw(kind))
            for kind in ("gate", "up", "down")]


def plan(spec: ModelSpec, recipe: Recipe | None = None) -> list[PlannedTensor]:
    """Every tensor of spec's model, in file order."""
    r = recipe or Recipe(spec)
    d, v, hd = spec.embd, spec.n_vocab, spec.head_dim
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    out = [
        PlannedTensor("token_embd.weight", (v, d), False, r.token_embd_rows),
        _fill("output_norm.weight", (d,), 1.0),
        PlannedTensor("output.weight", (v, d), False, r.output),
    ]
    post_norm = spec.arch in ("glm4moe", "gpt-oss", "qwen35moe")  # their FFN norm is post_attention_norm
    for il in range(spec.layers):
        blk = f"blk.{il}"

        def attn(key: str, il: int = il) -> Draw:
            return _once(lambda: r.attention(il, key))

        out.append(_fill(f"{blk}.attn_norm.weight", (d,), 1.0))
        if spec.is_recurrent_layer(il):
            out += _linear_attention(spec, r, il)
        else:
            if spec.arch == "deepseek2":
                out += _mla_attention(spec, r, il)
            else:
                q_rows = 2 * n_q if spec.arch == "qwen35moe" else n_q  # qwen35moe: each head's query, then its gate
                for key, rows in (("q", q_rows), ("k", n_kv), ("v", n_kv)):
                    out.append(PlannedTensor(f"{blk}.attn_{key}.weight", (rows, d), False, attn(key)))
                    if spec.arch in ("glm4moe", "gpt-oss"):
                        out.append(_fill(f"{blk}.attn_{key}.bias", (rows,)))
            out.append(PlannedTensor(f"{blk}.attn_output.weight", (d, n_q), False, attn("o")))
        if spec.arch == "gpt-oss":
            out.append(_fill(f"{blk}.attn_output.bias", (d,)))
            out.append(_fill(f"{blk}.attn_sinks.weight", (spec.n_head,)))
        if spec.arch == "qwen3moe" or (spec.arch == "qwen35moe" and not spec.is_recurrent_layer(il)):
            out.append(_fill(f"{blk}.attn_q_norm.weight", (hd,), 1.0))
            out.append(_fill(f"{blk}.attn_k_norm.weight", (hd,), 1.0))
        out.append(_fill(f"{blk}.{'post_attention_norm' if post_norm else 'ffn_norm'}.weight", (d,), 1.0))
        if not spec.is_moe_layer(il):
            ff = spec.dense_width
            out += _ffn(blk, "", lambda il=il: r.dense_ffn(il), {"gate": (ff, d), "up": (ff, d), "down": (d, ff)}, 1)
            continue
        out.append(PlannedTensor(f"{blk}.ffn_gate_inp.weight", (spec.experts, d), True,
                                 _once(lambda il=il: r.router(il))))
        if spec.arch == "gpt-oss":
            out.append(_fill(f"{blk}.ffn_gate_inp.bias", (spec.experts,)))
        if spec.arch == "glm4moe":
            out.append(_fill(f"{blk}.exp_probs_b.bias", (spec.experts,)))
        e, ff = spec.experts, spec.ff
        chunk = max(1, CHUNK_VALUES // (ff * d))
        out += _ffn(blk, "_exps", lambda il=il, chunk=chunk: r.experts(il, chunk=chunk),
                    {"gate": (e, ff, d), "up": (e, ff, d), "down": (e, d, ff)}, math.ceil(e / chunk))
        if spec.arch == "gpt-oss":
            out += [_fill(f"{blk}.ffn_gate_exps.bias", (e, ff)), _fill(f"{blk}.ffn_up_exps.bias", (e, ff)),
                    _fill(f"{blk}.ffn_down_exps.bias", (e, d))]
        if spec.shared_width:
            sf = spec.shared_width
            if spec.arch in ("qwen2moe", "qwen35moe"):
                out.append(PlannedTensor(f"{blk}.ffn_gate_inp_shexp.weight", (d,), True,
                                         _once(lambda il=il: r.shared_gate(il))))
            out += _ffn(blk, "_shexp", lambda il=il: r.shared_ffn(il),
                        {"gate": (sf, d), "up": (sf, d), "down": (d, sf)}, 1)
    return out


def _mla_attention(spec: ModelSpec, r: Recipe, il: int) -> list[PlannedTensor]:
    """deepseek2's attention as DeepSeek-V2-Lite's GGUF has it (MLA, no query compression; K and
    V decompressed by the split attn_k_b and attn_v_b, as llama.cpp's converter writes them); the
    output projection is the common one."""
    blk, d, hd = f"blk.{il}", spec.embd, spec.head_dim
    rank, rope, n_head = spec.kv_lora_rank, spec.rope_dim, spec.n_head

    def attn(key: str) -> Draw:
        return _once(lambda: r.mla_attention(il, key))

    return [
        PlannedTensor(f"{blk}.attn_q.weight", (n_head * (hd + rope), d), False, attn("q")),
        PlannedTensor(f"{blk}.attn_kv_a_mqa.weight", (rank + rope, d), False, attn("kv_a")),
        _fill(f"{blk}.attn_kv_a_norm.weight", (rank,), r.mla_kv_norm_gain()),
        PlannedTensor(f"{blk}.attn_k_b.weight", (n_head, rank, hd), False, attn("k_b")),
        PlannedTensor(f"{blk}.attn_v_b.weight", (n_head, hd, rank), False, attn("v_b")),
    ]


def _linear_attention(spec: ModelSpec, r: Recipe, il: int) -> list[PlannedTensor]:
    """qwen35moe's linear attention (a gated delta net) as llama.cpp's converter writes it: the
    joint Q/K/V projection and its causal convolution, the output gate (z), the per-head decay
    (alpha, dt bias, A) and write strength (beta), the gated norm and the output projection."""
    blk, d = f"blk.{il}", spec.embd
    value_dim, n_v = spec.linear_value_dim, spec.n_linear_heads
    conv_dim = 2 * spec.linear_key_dim + value_dim

    def lin(key: str) -> Draw:
        return _once(lambda: r.linear_attention(il, key))

    return [
        PlannedTensor(f"{blk}.attn_qkv.weight", (conv_dim, d), False, lin("qkv")),
        PlannedTensor(f"{blk}.attn_gate.weight", (value_dim, d), False, lin("gate")),
        PlannedTensor(f"{blk}.ssm_conv1d.weight", (conv_dim, LINEAR_CONV_KERNEL), True, lin("conv1d")),
        _fill(f"{blk}.ssm_dt.bias", (n_v,)),
        _fill(f"{blk}.ssm_a", (n_v,), -1.0),
        PlannedTensor(f"{blk}.ssm_beta.weight", (n_v, d), True, lin("beta")),
        PlannedTensor(f"{blk}.ssm_alpha.weight", (n_v, d), True, lin("alpha")),
        _fill(f"{blk}.ssm_norm.weight", (spec.linear_head_dim,), 1.0),
        PlannedTensor(f"{blk}.ssm_out.weight", (d, value_dim), False, lin("out")),
    ]


def n_params(spec: ModelSpec) -> int:
    """The model's parameter count, as llama.cpp reports it (every tensor's elements)."""
    return sum(math.prod(t.shape) for t in plan(spec))
