"""The weights of a generated model: random, but routed like a real MoE (docs/models.md).

R^D is split by a random orthonormal basis into a shared direction u, a topic subspace, a
context subspace and the rest (token identity):
- embeddings (RMS ~ 1) hold a bit of u, a topic vector set by the token's byte class plus a
  small per-token part, and a token-identity part;
- attention has zero queries, so it averages uniformly over earlier positions; its values read
  the topic subspace and its output writes a per-layer rotation of it into the context
  subspace: every layer adds the running mean of earlier topics;
- router rows = graded weights on u (normal quantiles, shuffled per layer: popularity skew) +
  topic and context read-outs (locality, per-text hot sets) + noise that reads only token
  identity (per-token variety);
- experts are small and random; the output head reads token identity only.

Every tensor is drawn from its own generator seeded by (seed, tensor name), so the bytes do
not depend on the order in which tensors are generated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from functools import cached_property
from statistics import NormalDist

import numpy as np

from bevy_gguf.synth.spec import ModelSpec
from bevy_gguf.synth.tokenizer import CLASSES, N_VOCAB, token_class

TOPIC_DIMS = 16
CONTEXT_DIMS = 16

# embedding mix (squares sum to ~1: RMS ~ 1)
EMB_U = 0.30        # shared direction
EMB_TOPIC = 0.55    # byte-class topic (+ per-token part below)
EMB_TOKEN_TOPIC = 0.35  # per-token share inside the topic vector
EMB_ID = 0.78       # token identity

# byte-class shares of typical text; topics are centred on them (TOPIC_CENTERING of the way)
TYPICAL_CLASS_SHARE = {"lower": 0.55, "upper": 0.04, "digit": 0.05, "space": 0.17, "punct": 0.08,
                       "utf8_lead": 0.03, "utf8_cont": 0.06, "other": 0.02}
TOPIC_CENTERING = 1.0

ATTN_CONTEXT_GAIN = 0.9   # how strongly each layer writes the running topic mean

# router logit spread (standard deviation) contributed by each part of a router row
ROUTER_SKEW = 1.0     # graded weight on u: the same for every token (expert popularity)
ROUTER_SKEW_TAIL = 0.3  # extra weight on the most popular experts
ROUTER_TOPIC = 1.0    # reads the byte-class topic (locality within words, per-text hot sets)
ROUTER_CONTEXT = 3.0  # reads the running topic mean (per-text hot sets)
ROUTER_NOISE = 1.1    # reads token identity (per-token variety)
CONTEXT_RMS = 0.5     # rough RMS share of the context subspace in the normalized residual

CHUNK_VALUES = 1 << 24  # values drawn at once by the streaming writer (64 MB of float32)

EXPERT_OUT = 0.08   # RMS of one expert's output relative to the residual (small)
LINEAR_CONV_KERNEL = 4  # qwen35moe's linear attention: its causal convolution's width (Qwen3.5's)
LINEAR_OUT = 0.08   # RMS of a linear-attention layer's output relative to the residual (small, as an expert's)
HEAD_LOGIT_STD = 8.0  # spread of the output logits


def _stable_seed(seed: int, name: str) -> list[int]:
    digest = hashlib.sha256(name.encode()).digest()
    return [seed, int.from_bytes(digest[:8], "little")]


def _unit(rng: np.random.Generator, *shape: int) -> np.ndarray:
    v = rng.standard_normal(shape)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


class Recipe:
    """Draws every tensor of a generated model, as float32 in numpy's (out, in) orientation."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.dim_id = spec.embd - 1 - TOPIC_DIMS - CONTEXT_DIMS

    def rng(self, name: str) -> np.random.Generator:
        # the arch is part of the key: each arch computes its own function
        return np.random.default_rng(_stable_seed(self.spec.seed, f"{self.spec.arch}/{name}"))

    @cached_property
    def basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(u [D], T [D,16], C [D,16], I [D,rest]) from one random orthonormal basis."""
        d = self.spec.embd
        q, _ = np.linalg.qr(self.rng("basis").standard_normal((d, d)))
        u = q[:, 0]
        t = q[:, 1 : 1 + TOPIC_DIMS]
        c = q[:, 1 + TOPIC_DIMS : 1 + TOPIC_DIMS + CONTEXT_DIMS]
        i = q[:, 1 + TOPIC_DIMS + CONTEXT_DIMS :]
        return u, t, c, i

    @cached_property
    def token_ids(self) -> np.ndarray:
        """[V, dim_id] unit identity vectors (also what the head and router noise read)."""
        return _unit(self.rng("token_ids"), N_VOCAB, self.dim_id)

    def token_embd(self) -> np.ndarray:
        u, t, _, i = self.basis
        rng = self.rng("token_embd")
        class_topic = _unit(rng, len(CLASSES), TOPIC_DIMS)
        # centre on typical text, so a text's running mean says how it differs from typical text
        typical = np.array([TYPICAL_CLASS_SHARE[c] for c in CLASSES])
        class_topic = class_topic - TOPIC_CENTERING * (typical / typical.sum()) @ class_topic
        class_topic /= np.sqrt((typical / typical.sum()) @ (class_topic**2).sum(1))
        token_topic = _unit(rng, N_VOCAB, TOPIC_DIMS)
        cls = np.array([CLASSES.index(token_class(v)) for v in range(N_VOCAB)])
        topic = (1 - EMB_TOKEN_TOPIC) * class_topic[cls] + EMB_TOKEN_TOPIC * token_topic
        emb = EMB_U * u[None, :] + EMB_TOPIC * topic @ t.T + EMB_ID * self.token_ids @ i.T
        return (emb * np.sqrt(self.spec.embd)).astype(np.float32)

    def attention(self, layer: int, key: str) -> np.ndarray:
        """Attention weight `key` (q, k, v or o) of a layer: zero queries and keys; v reads the
        topic, o writes it rotated into C (GQA: head 0's KV head carries the topic, and every
        query head of its group reads it). Each is drawn alone (o's rotation has its own seed)."""
        s, d = self.spec, self.spec.embd
        gated = s.arch == "qwen35moe"  # its query projection also gives each head a sigmoid output gate
        rows = {"q": s.n_head * s.head_dim * (2 if gated else 1), "k": s.n_head_kv * s.head_dim,
                "v": s.n_head_kv * s.head_dim}
        _, t, c, _ = self.basis
        if key in ("q", "k"):
            return np.zeros((rows[key], d), dtype=np.float32)
        if key == "v":
            wv = np.zeros((rows["v"], d))
            wv[:TOPIC_DIMS, :] = t.T                       # head 0 carries the topic coordinates
            return wv.astype(np.float32)
        rot, _ = np.linalg.qr(self.rng(f"blk.{layer}.attn_rot").standard_normal((TOPIC_DIMS, TOPIC_DIMS)))
        wo = np.zeros((d, s.n_head * s.head_dim))
        # ... and writes them into the context (qwen35moe: twice, as its zero gate halves them: sigmoid(0))
        wo[:, :TOPIC_DIMS] = (2.0 if gated else 1.0) * ATTN_CONTEXT_GAIN * c @ rot
        return wo.astype(np.float32)

    def mla_attention(self, layer: int, key: str) -> np.ndarray:
        """deepseek2's attention weight `key`: zero queries (q) and key decompression (k_b), so it
        averages over earlier positions as above; the compressed KV (kv_a) reads the topic into
        its first coordinates, and head 0's value decompression (v_b) passes them to the output
        projection (attention() "o"), which writes them into the context."""
        s, d = self.spec, self.spec.embd
        rank, rope, hd = s.kv_lora_rank, s.rope_dim, s.head_dim
        _, t, _, _ = self.basis
        if key == "q":
            return np.zeros((s.n_head * (hd + rope), d), dtype=np.float32)
        if key == "k_b":
            return np.zeros((s.n_head, rank, hd), dtype=np.float32)
        if key == "kv_a":
            w = np.zeros((rank + rope, d))
            w[:TOPIC_DIMS, :] = t.T
            return w.astype(np.float32)
        wv = np.zeros((s.n_head, hd, rank))
        wv[0, :TOPIC_DIMS, :TOPIC_DIMS] = np.eye(TOPIC_DIMS)
        return wv.astype(np.float32)

    def linear_attention(self, layer: int, key: str) -> np.ndarray:
        """qwen35moe's linear-attention weight `key`: small random projections, so each layer
        keeps a real recurrent state (a layer-range call that advanced it twice would show) while
        its output (out) adds about LINEAR_OUT of the residual, as an expert does: the routing
        comes from the attention layers' context, as in the other archs."""
        s, d = self.spec, self.spec.embd
        rng = self.rng(f"blk.{layer}.linear_attn.{key}")
        key_dim, value_dim = s.linear_key_dim, s.linear_value_dim
        shapes = {"qkv": (2 * key_dim + value_dim, d), "gate": (value_dim, d), "beta": (s.n_linear_heads, d),
                  "alpha": (s.n_linear_heads, d), "conv1d": (2 * key_dim + value_dim, LINEAR_CONV_KERNEL),
                  "out": (d, value_dim)}
        w = rng.standard_normal(shapes[key], dtype=np.float32)
        if key == "conv1d":
            return w / np.float32(np.sqrt(LINEAR_CONV_KERNEL))
        if key == "out":  # the gated norm's output has RMS about 0.4 (RMS 1 times silu of a unit gate)
            return w * np.float32(LINEAR_OUT / (0.4 * np.sqrt(value_dim)))
        return w / np.float32(np.sqrt(d))

    def mla_kv_norm_gain(self) -> float:
        """attn_kv_a_norm's weight: the compressed KV is RMS-normalized over its width, which
        would scale a token's topic (its only content) to norm sqrt(rank); this brings it back to
        about the norm the topic has in the normalized residual (sqrt(D) x EMB_TOPIC)."""
        return float(np.sqrt(self.spec.embd) * EMB_TOPIC / np.sqrt(self.spec.kv_lora_rank))

    def router(self, layer: int) -> np.ndarray:
        """[E, D] router rows."""
        s = self.spec
        u, t, c, i = self.basis
        rng = self.rng(f"blk.{layer}.ffn_gate_inp")
        quantiles = (np.arange(s.experts) + 0.5) / s.experts
        grades = np.array([NormalDist().inv_cdf(q) for q in quantiles])
        grades = grades + ROUTER_SKEW_TAIL * np.maximum(grades, 0.0) ** 2  # a few very popular experts
        rng.shuffle(grades)
        w_topic = _unit(rng, s.experts, TOPIC_DIMS)
        w_ctx = _unit(rng, s.experts, CONTEXT_DIMS)
        w_noise = _unit(rng, s.experts, self.dim_id)
        sd = np.sqrt(s.embd)  # the normalized residual has norm ~ sqrt(D)
        rows = (
            ROUTER_SKEW / (sd * EMB_U) * grades[:, None] * u[None, :]
            + ROUTER_TOPIC * np.sqrt(TOPIC_DIMS) / (sd * EMB_TOPIC) * w_topic @ t.T
            + ROUTER_CONTEXT * np.sqrt(CONTEXT_DIMS) / (sd * CONTEXT_RMS) * w_ctx @ c.T
            + ROUTER_NOISE * np.sqrt(self.dim_id) / (sd * EMB_ID) * w_noise @ i.T
        )
        return rows.astype(np.float32)

    def experts(self, layer: int, ff: int | None = None, name: str = "exps",
                chunk: int | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """gate, up [E, ff, D] and down [E, D, ff]: small random experts, as (kind, chunk of
        experts) in file order (gate's chunks, then up's, then down's), so that memory holds one
        chunk; the values do not depend on the chunk size (one generator, drawn in order)."""
        s = self.spec
        ff = ff or s.ff
        n = s.experts if name == "exps" else 1
        chunk = chunk or max(1, CHUNK_VALUES // (ff * s.embd))
        rng = self.rng(f"blk.{layer}.ffn_{name}")
        # silu(g)*u has RMS ~0.6; scale down so one expert adds ~EXPERT_OUT of the residual RMS
        for kind in ("gate", "up", "down"):
            shape = (ff, s.embd) if kind != "down" else (s.embd, ff)
            for first in range(0, n, chunk):
                w = rng.standard_normal((min(chunk, n - first), *shape), dtype=np.float32)
                if kind == "down":
                    yield kind, w * np.float32(EXPERT_OUT / (0.6 * np.sqrt(ff)))
                else:
                    yield kind, w / np.float32(np.sqrt(s.embd))

    def dense_ffn(self, layer: int) -> Iterator[tuple[str, np.ndarray]]:
        """A dense leading layer's gate, up [ff, D] and down [D, ff] (one expert's recipe, wider)."""
        for kind, w in self.experts(layer, ff=self.spec.dense_width, name="dense"):
            yield kind, w[0]

    def shared_ffn(self, layer: int) -> Iterator[tuple[str, np.ndarray]]:
        """The shared expert's gate, up [ff, D] and down [D, ff]."""
        for kind, w in self.experts(layer, ff=self.spec.shared_width, name="shexp"):
            yield kind, w[0]

    def shared_gate(self, layer: int) -> np.ndarray:
        """qwen2moe's sigmoid gate row of the shared expert."""
        return (self.rng(f"blk.{layer}.ffn_gate_inp_shexp").standard_normal(self.spec.embd)
                / np.sqrt(self.spec.embd)).astype(np.float32)

    def output(self) -> Iterator[np.ndarray]:
        """[V, D] head rows that read token identity only, in row chunks; the padding tokens'
        rows read -u (the residual's shared direction), so their logits sit far below."""
        s = self.spec
        u, _, _, i = self.basis
        h = _unit(self.rng("output"), N_VOCAB, self.dim_id)
        # the normalized residual carries sqrt(D)*EMB_ID of identity: scale to HEAD_LOGIT_STD
        gain = HEAD_LOGIT_STD * np.sqrt(self.dim_id) / (np.sqrt(s.embd) * EMB_ID)
        yield (gain * h @ i.T).astype(np.float32)
        pad_row = (-2 * HEAD_LOGIT_STD / (np.sqrt(s.embd) * EMB_U) * u).astype(np.float32)
        yield from _rows(pad_row, s.n_vocab - N_VOCAB, s.embd)

    def token_embd_rows(self) -> Iterator[np.ndarray]:
        """token_embd in row chunks: the tokenizer's tokens, then zero rows for the padding."""
        yield self.token_embd()
        yield from _rows(np.zeros(self.spec.embd, dtype=np.float32), self.spec.n_vocab - N_VOCAB, self.spec.embd)


def _rows(row: np.ndarray, n: int, width: int) -> Iterator[np.ndarray]:
    """n copies of row, in chunks of about CHUNK_VALUES values."""
    step = max(1, CHUNK_VALUES // width)
    for first in range(0, n, step):
        yield np.broadcast_to(row, (min(step, n - first), width))
