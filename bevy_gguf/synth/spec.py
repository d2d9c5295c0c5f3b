"""What a generated model is: its parameters, validated, and its cache key."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

from bevy_gguf.errors import BevyError

ARCHS = ("qwen3moe", "qwen2moe", "mixtral")
DTYPES = ("f16", "q8_0")
# llama-quantize's file types that need no importance matrix (the IQ1/IQ2 ones do, and we make none)
QUANTIZE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
                  "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M", "MXFP4_MOE",
                  "F16", "BF16")
TENSOR_TYPE = re.compile(r"[A-Za-z0-9_.]+=[A-Za-z0-9_]+")  # llama-quantize --tensor-type NAME=TYPE


@cache
def recipe_digest() -> str:
    """A short hash of the code that generates the bytes (part of the cache key)."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("recipe.py", "tokenizer.py", "writer.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:10]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Parameters of `bevy-gguf make-model`; the defaults are the benchmark's default model (docs/benchmark.md)."""

    arch: str = "qwen3moe"
    layers: int = 8
    experts: int = 64
    top_k: int = 8
    embd: int = 512
    ff: int = 512
    dtype: str = "q8_0"
    seed: int = 0
    quantize: str = ""                  # a llama-quantize type (Q4_K_M, ...): the model passed through it
    tensor_types: tuple[str, ...] = ()  # its --tensor-type NAME=TYPE overrides (dynamic-quant-like mixes)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise BevyError(f"unknown arch {self.arch!r}: choose one of {', '.join(ARCHS)}")
        if self.dtype not in DTYPES:
            raise BevyError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if not 1 <= self.layers <= 256:
            raise BevyError(f"--layers {self.layers} is out of range: use 1..256")
        if not 2 <= self.experts <= 1024:
            raise BevyError(f"--experts {self.experts} is out of range: use 2..1024")
        if not 1 <= self.top_k <= self.experts:
            raise BevyError(f"--top-k {self.top_k} must lie in 1..--experts ({self.experts})")
        if self.embd < 64 or self.embd % 32:
            raise BevyError(f"--embd {self.embd} must be a multiple of 32 and at least 64")
        if self.ff < 32 or self.ff % 32:
            raise BevyError(f"--ff {self.ff} must be a multiple of 32 and at least 32")
        if self.seed < 0:
            raise BevyError(f"--seed {self.seed} must be >= 0")
        if self.quantize and self.quantize not in QUANTIZE_TYPES:
            raise BevyError(f"unknown --quantize {self.quantize!r}: choose one of {', '.join(QUANTIZE_TYPES)}")
        for tt in self.tensor_types:
            if not TENSOR_TYPE.fullmatch(tt):
                raise BevyError(f"--tensor-type {tt!r} is not NAME=TYPE (e.g. ffn_down_exps=q6_k)")
        if self.tensor_types and not self.quantize:
            raise BevyError("--tensor-type needs --quantize TYPE (the types the rest of the model gets)")

    @property
    def head_dim(self) -> int:
        return 64 if self.embd >= 256 else 32

    @property
    def n_head(self) -> int:
        return self.embd // self.head_dim

    @property
    def key(self) -> str:
        """A file-name-safe key naming these parameters and the recipe version."""
        quant = f"-{self.quantize}" if self.quantize else ""
        if self.tensor_types:
            quant += "-tt" + hashlib.sha256("\n".join(self.tensor_types).encode()).hexdigest()[:8]
        return (
            f"{self.arch}-L{self.layers}-E{self.experts}-k{self.top_k}-D{self.embd}-F{self.ff}"
            f"-{self.dtype}-s{self.seed}{quant}-{recipe_digest()}"
        )

    @property
    def base(self) -> ModelSpec:
        """The model llama-quantize starts from (this one, if it is not quantized)."""
        return replace(self, quantize="", tensor_types=())

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
