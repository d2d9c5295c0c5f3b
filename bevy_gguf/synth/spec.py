"""What a generated model is: its parameters, validated, and its cache key."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

from bevy_gguf.errors import BevyError
from bevy_gguf.synth.tokenizer import N_VOCAB

ARCHS = ("qwen3moe", "qwen2moe", "mixtral", "glm4moe", "gpt-oss", "deepseek2", "qwen35moe")
SHARED_EXPERT_ARCHS = ("qwen2moe", "glm4moe", "deepseek2", "qwen35moe")  # archs whose MoE layers have a shared expert
DENSE_LEAD_ARCHS = ("glm4moe", "deepseek2")                # archs that may start with dense FFN layers
DTYPES = ("f16", "q8_0")
# llama-quantize's file types; those it quantizes only with an importance matrix (IMATRIX_TYPES) get a
# flat one (writer.flat_imatrix: test models, whose weights are random anyway)
IMATRIX_TYPES = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S")
QUANTIZE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
                  "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M", "MXFP4_MOE",
                  "F32", "F16", "BF16") + IMATRIX_TYPES
MIN_VOCAB = N_VOCAB
TOPIC_HEAD_MIN = 16  # head 0 carries the recipe's 16 topic coordinates (recipe.py)
# the shape fields in the key, where set: tag
SHAPE_TAGS = (("heads", "H"), ("kv_heads", "KV"), ("head_size", "hd"), ("shared_ff", "SF"),
              ("dense_layers", "DL"), ("dense_ff", "DF"), ("vocab", "V"), ("kv_lora", "KL"),
              ("linear_heads", "LH"), ("linear_key_heads", "LKH"), ("linear_head_size", "LHD"))
FULL_ATTENTION_INTERVAL = 4  # qwen35moe: every 4th layer attends, the others are linear attention (gated delta net)
TENSOR_TYPE = re.compile(r"[A-Za-z0-9_.]+=[A-Za-z0-9_]+")  # llama-quantize --tensor-type NAME=TYPE


@cache
def recipe_digest() -> str:
    """A short hash of the code that generates the bytes (part of the cache key)."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("recipe.py", "tensors.py", "tokenizer.py", "writer.py"):
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
    # real shapes (0: the small models' defaults, as before these existed)
    heads: int = 0         # attention heads (0: embd / head_dim)
    kv_heads: int = 0      # KV heads, GQA (0: heads)
    head_size: int = 0     # dimension of a head (0: 64, or 32 below 256 wide)
    shared_ff: int = 0     # width of the shared expert (0: ff); qwen2moe and glm4moe have one
    dense_layers: int = 0  # leading layers with a dense FFN instead of experts (glm4moe)
    dense_ff: int = 0      # their width (0: 4 * ff)
    vocab: int = 0         # vocabulary padded with unused tokens to this size (0: the tokenizer's own)
    kv_lora: int = 0       # deepseek2's compressed KV width, MLA's kv_lora_rank (0: 4 x head_size)
    linear_heads: int = 0      # qwen35moe's linear-attention value heads (0: 2 x linear key heads)
    linear_key_heads: int = 0  # ... its key heads (0: heads)
    linear_head_size: int = 0  # ... the size of its key and value heads, the recurrent state's (0: head size)

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
        self._check_shape()

    def _check_shape(self) -> None:
        for name in ("heads", "kv_heads", "head_size", "shared_ff", "dense_layers", "dense_ff", "vocab", "kv_lora",
                     "linear_heads", "linear_key_heads", "linear_head_size"):
            if getattr(self, name) < 0:
                raise BevyError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 0")
        if self.head_size and (self.head_size < TOPIC_HEAD_MIN or self.head_size % 2):
            raise BevyError(f"--head-size {self.head_size} must be even and at least {TOPIC_HEAD_MIN}")
        if (self.n_head * self.head_dim) % 32:
            raise BevyError(f"--heads x --head-size ({self.n_head} x {self.head_dim}) must be a multiple of 32")
        if self.n_head % self.n_head_kv:
            raise BevyError(f"--heads {self.n_head} must be a multiple of --kv-heads {self.n_head_kv}")
        if self.shared_ff % 32 or self.dense_ff % 32:
            raise BevyError("--shared-ff and --dense-ff must be multiples of 32")
        if self.shared_ff and self.arch not in SHARED_EXPERT_ARCHS:
            raise BevyError(f"--shared-ff: {self.arch} has no shared expert ({', '.join(SHARED_EXPERT_ARCHS)} do)")
        if self.dense_layers and self.arch not in DENSE_LEAD_ARCHS:
            raise BevyError(f"--dense-layers: {self.arch} has no dense leading layers "
                            f"({', '.join(DENSE_LEAD_ARCHS)} do)")
        if self.dense_layers >= self.layers:
            raise BevyError(f"--dense-layers {self.dense_layers} leaves no MoE layer of --layers {self.layers}")
        if self.kv_lora and self.arch != "deepseek2":
            raise BevyError(f"--kv-lora: {self.arch} has no compressed KV (deepseek2 has)")
        if self.arch == "deepseek2":
            self._check_mla()
        linear = (self.linear_heads, self.linear_key_heads, self.linear_head_size)
        if any(linear) and self.arch != "qwen35moe":
            raise BevyError(f"--linear-*: {self.arch} has no linear-attention layers (qwen35moe has)")
        if self.arch == "qwen35moe":
            self._check_linear()
        if self.vocab and self.vocab < MIN_VOCAB:
            raise BevyError(f"--vocab {self.vocab} is below the tokenizer's {MIN_VOCAB} tokens")

    def _check_mla(self) -> None:
        if self.kv_lora % 32:
            raise BevyError(f"--kv-lora {self.kv_lora} must be a multiple of 32")
        if self.head_dim % 4:
            raise BevyError(f"--head-size {self.head_dim}: deepseek2 rotates half of it, so it must be a multiple of 4")
        if self.kv_heads and self.kv_heads != self.n_head:
            raise BevyError("--kv-heads: deepseek2's attention (MLA) shares one compressed KV, leave it unset")
        if self.shared_ff and self.shared_ff % self.ff:
            raise BevyError(f"--shared-ff {self.shared_ff}: deepseek2's shared experts are --ff wide each, "
                            f"so it must be a multiple of --ff {self.ff}")

    def _check_linear(self) -> None:
        if self.n_linear_heads % self.n_linear_key_heads:
            raise BevyError(f"--linear-heads {self.n_linear_heads} must be a multiple of "
                            f"--linear-key-heads {self.n_linear_key_heads}")
        if self.linear_head_dim % 2 or self.linear_head_dim < TOPIC_HEAD_MIN:
            raise BevyError(f"--linear-head-size {self.linear_head_dim} must be even and at least {TOPIC_HEAD_MIN}")
        if self.linear_value_dim % 32:
            raise BevyError(f"--linear-heads x --linear-head-size ({self.n_linear_heads} x {self.linear_head_dim}) "
                            "must be a multiple of 32")
        if self.head_dim % 8:
            raise BevyError(f"--head-size {self.head_dim}: qwen35moe rotates a quarter of it in three sections, "
                            "so it must be a multiple of 8")

    @property
    def head_dim(self) -> int:
        return self.head_size or (64 if self.embd >= 256 else 32)

    @property
    def n_head(self) -> int:
        return self.heads or self.embd // self.head_dim

    @property
    def n_head_kv(self) -> int:
        return self.kv_heads or self.n_head

    @property
    def n_vocab(self) -> int:
        return self.vocab or MIN_VOCAB

    @property
    def shared_width(self) -> int:
        """The shared expert's width (0: none)."""
        return (self.shared_ff or self.ff) if self.arch in SHARED_EXPERT_ARCHS else 0

    @property
    def n_shared_experts(self) -> int:
        """deepseek2's shared experts (its shared width over the expert width)."""
        return self.shared_width // self.ff if self.shared_width else 0

    @property
    def kv_lora_rank(self) -> int:
        """deepseek2's compressed KV width (MLA): a head's K and V are decompressed from it."""
        return self.kv_lora or 4 * self.head_dim

    @property
    def rope_dim(self) -> int:
        """deepseek2's rotated part of a key (qk_rope_head_dim), beside head_size unrotated dims."""
        return self.head_dim // 2

    @property
    def n_linear_key_heads(self) -> int:
        return self.linear_key_heads or self.n_head

    @property
    def n_linear_heads(self) -> int:
        return self.linear_heads or 2 * self.n_linear_key_heads

    @property
    def linear_head_dim(self) -> int:
        return self.linear_head_size or self.head_dim

    @property
    def linear_key_dim(self) -> int:
        """qwen35moe's linear attention: the width of its queries and of its keys."""
        return self.n_linear_key_heads * self.linear_head_dim

    @property
    def linear_value_dim(self) -> int:
        """... of its values (llama.cpp's ssm inner size)."""
        return self.n_linear_heads * self.linear_head_dim

    def is_recurrent_layer(self, il: int) -> bool:
        """qwen35moe: a linear-attention layer (a gated delta net with a recurrent state)."""
        return self.arch == "qwen35moe" and (il + 1) % FULL_ATTENTION_INTERVAL != 0

    @property
    def dense_width(self) -> int:
        return self.dense_ff or 4 * self.ff

    def is_moe_layer(self, il: int) -> bool:
        return il >= self.dense_layers

    @property
    def key(self) -> str:
        """A file-name-safe key naming these parameters and the recipe version."""
        quant = f"-{self.quantize}" if self.quantize else ""
        if self.tensor_types:
            quant += "-tt" + hashlib.sha256("\n".join(self.tensor_types).encode()).hexdigest()[:8]
        shape = "".join(f"-{tag}{getattr(self, name)}" for name, tag in SHAPE_TAGS if getattr(self, name))
        return (
            f"{self.arch}-L{self.layers}-E{self.experts}-k{self.top_k}-D{self.embd}-F{self.ff}{shape}"
            f"-{self.dtype}-s{self.seed}{quant}-{recipe_digest()}"
        )

    @property
    def base(self) -> ModelSpec:
        """The model llama-quantize starts from (this one, if it is not quantized)."""
        return replace(self, quantize="", tensor_types=())

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
