"""Reads what bevy-gguf needs from a GGUF file, and refuses files it cannot serve."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from bevy_gguf.errors import BevyError

GGUF_MAGIC = b"GGUF"
# routed expert tensors: blk.N.ffn_{gate,up,down,gate_up}_exps.{weight,scale}
EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.(weight|scale)$")


@dataclass(frozen=True, slots=True)
class ExpertTensor:
    name: str
    layer: int
    kind: str          # gate, up, down, gate_up (with '.scale' for scale tensors)
    offset: int        # absolute byte offset in the file
    nbytes: int
    n_expert: int      # size of the last dimension
    ggml_type: str
    ne: tuple[int, int] = (0, 0)  # one expert's [ne0, ne1] (ggml order: row length, rows)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: Path
    arch: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    n_embd: int
    file_bytes: int
    expert_tensors: tuple[ExpertTensor, ...]
    recurrent: bool = False  # layers with a recurrent state (qwen35moe's linear attention, Mamba's)

    @property
    def expert_bytes(self) -> int:
        """Bytes of all routed expert tensors (the base of `--expert-cache N%`)."""
        return sum(t.nbytes for t in self.expert_tensors)

    @property
    def moe_layers(self) -> list[int]:
        return sorted({t.layer for t in self.expert_tensors})


def _field(reader: gguf.GGUFReader, key: str) -> object | None:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def inspect_model(path: str | Path, require_experts: bool = True) -> ModelInfo:
    """Validate path as a GGUF with routed experts and describe it; BevyError otherwise."""
    path = Path(path)
    if not path.exists():
        raise BevyError(f"model file {path} does not exist: check the path")
    if path.is_dir():
        raise BevyError(f"{path} is a directory: give the path of a .gguf file")
    size = path.stat().st_size
    if size == 0:
        raise BevyError(f"model file {path} is empty: regenerate or re-download it")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise BevyError(f"{path} is not a GGUF file (magic {magic!r}): give a .gguf model")
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the reader raises many types on corrupt headers
        raise BevyError(f"{path} is a truncated or corrupt GGUF ({type(e).__name__}: {e}): regenerate it") from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise BevyError(f"{path} is truncated ({size} bytes, its tensors need {end}): regenerate it")
    arch = str(_field(reader, "general.architecture") or "")
    if not arch:
        raise BevyError(f"{path} has no general.architecture: it is not a llama.cpp model")

    experts = []
    for t in reader.tensors:
        m = EXPERT_TENSOR.match(t.name)
        if m:
            kind = m.group(2) + (".scale" if m.group(3) == "scale" else "")
            experts.append(ExpertTensor(
                name=t.name, layer=int(m.group(1)), kind=kind, offset=int(t.data_offset),
                nbytes=int(t.n_bytes), n_expert=int(t.shape[-1]), ggml_type=t.tensor_type.name,
                ne=(int(t.shape[0]), int(t.shape[1])),
            ))
    n_expert = int(_field(reader, f"{arch}.expert_count") or 0)
    if require_experts and (not experts or n_expert == 0):
        raise BevyError(f"{path} has no routed experts (arch {arch}, no *_exps tensors): bevy-gguf serves MoE models")
    return ModelInfo(
        path=path,
        arch=arch,
        n_layer=int(_field(reader, f"{arch}.block_count") or 0),
        n_expert=n_expert,
        n_expert_used=int(_field(reader, f"{arch}.expert_used_count") or 0),
        n_embd=int(_field(reader, f"{arch}.embedding_length") or 0),
        file_bytes=size,
        expert_tensors=tuple(experts),
        recurrent=_field(reader, f"{arch}.ssm.state_size") is not None,
    )


def router_weights(path: str | Path) -> dict[int, np.ndarray]:
    """Each MoE layer's router (ffn_gate_inp) as float32 [n_expert, n_embd]."""
    import numpy as np

    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        m = re.match(r"^blk\.(\d+)\.ffn_gate_inp\.weight$", t.name)
        if m:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
            rows, cols = int(t.shape[1]), int(t.shape[0])
            out[int(m.group(1))] = np.ascontiguousarray(data.reshape(rows, cols), dtype=np.float32)
    return out
