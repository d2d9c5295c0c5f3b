"""Owns llama.cpp handles (model, context, batch) through llama-cpp-python's low-level API.

Return codes become BevyError with the code in the message; handles are freed in order (a
context before its model) by `close()` or the context manager.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from bevy_gguf.errors import BevyError

if TYPE_CHECKING:
    from bevy_gguf._native.bevy_handles import Hook


@dataclass(frozen=True, slots=True)
class ContextParams:
    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_threads: int
    n_ubatch: int | None = None  # tokens per graph evaluation (default: n_batch)
    kv_unified: bool = False  # llama.cpp's default: a KV stream per sequence (llama-server's -kvu: True)
    flash_attn_type: int = -1  # LLAMA_FLASH_ATTN_TYPE_*: -1 auto (llama.cpp's default), 0 off, 1 on


class _BuftOverride(ctypes.Structure):
    """llama_model_tensor_buft_override: tensors whose name matches pattern go to buft."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_moe_overrides(llama_cpp: ModuleType, n_layers: int) -> ctypes.Array:
    """llama.cpp's --n-cpu-moe N (-ot blk.I.ffn_*_exps=CPU for I < N): the NULL-terminated
    override list that keeps the routed experts of the first n_layers layers in host memory
    (computed on the CPU, as stock's offload baseline on a GPU)."""
    lib = llama_cpp.llama_cpp._lib  # ggml's symbols resolve through libllama's dependencies
    by_name, buft_of = lib.ggml_backend_dev_by_name, lib.ggml_backend_dev_buffer_type
    by_name.argtypes, by_name.restype = [ctypes.c_char_p], ctypes.c_void_p
    buft_of.argtypes, buft_of.restype = [ctypes.c_void_p], ctypes.c_void_p
    cpu = buft_of(by_name(b"CPU"))
    overrides = (_BuftOverride * (n_layers + 1))()
    for il in range(n_layers):
        overrides[il].pattern = rf"blk\.{il}\.ffn_(up|down|gate|gate_up)_(ch|)exps".encode()
        overrides[il].buft = cpu
    return overrides


class Model:
    """A loaded llama_model and its vocabulary."""

    def __init__(self, llama_cpp: ModuleType, path: Path, repack: bool = True, gpu_layers: int = 0,
                 cpu_moe_layers: int = 0, vocab_only: bool = False, load_mode: int = -1) -> None:
        """gpu_layers: llama.cpp's -ngl; cpu_moe_layers: its --n-cpu-moe (the routed experts of the
        first N layers stay in host memory); vocab_only: the vocabulary alone (no weights);
        load_mode: llama.cpp's llama_load_mode (-1 auto: mmap; 0 none: read into memory at load)."""
        self.lib = llama_cpp
        self.path = path
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = vocab_only
        params.load_mode = load_mode
        params.n_gpu_layers = gpu_layers  # llama.cpp's -ngl
        if cpu_moe_layers:
            self._overrides = cpu_moe_overrides(llama_cpp, cpu_moe_layers)  # alive while the model loads
            params.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        params.use_extra_bufts = repack  # llama.cpp's --no-repack: weights stay as mapped from the file
        self.ptr = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.ptr:
            raise BevyError(f"llama.cpp could not load {path}: is it a complete GGUF of a supported architecture?")
        self.vocab = llama_cpp.llama_model_get_vocab(self.ptr)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_layer = llama_cpp.llama_model_n_layer(self.ptr)
        self.n_embd = llama_cpp.llama_model_n_embd(self.ptr)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ctypes.c_int32 * n_max)()
        n = self.lib.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_bos, False)
        if n < 0:
            raise BevyError(f"tokenization needs {-n} tokens, more than expected: report this")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[: max(n, 0)]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self.vocab, token))

    def special_text(self, which: str) -> str:
        """The text of the vocabulary's "bos" or "eos" token ("" if it has none)."""
        token = (self.lib.llama_vocab_bos if which == "bos" else self.lib.llama_vocab_eos)(self.vocab)
        return self.piece(token).decode(errors="ignore") if token >= 0 else ""

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text (llama_model_meta_val_str), or None."""
        size = 1 << 10
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self.lib.llama_model_meta_val_str(self.ptr, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode(errors="replace")
            size = n + 1

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_model_free(self.ptr)
        self.ptr = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Context:
    """A llama_context on a Model, with one reusable batch."""

    def __init__(self, model: Model, params: ContextParams) -> None:
        lib = self.lib = model.lib
        self.model = model
        cp = lib.llama_context_default_params()
        cp.n_ctx = params.n_ctx
        cp.n_batch = params.n_batch
        cp.n_ubatch = params.n_ubatch or params.n_batch
        cp.n_seq_max = params.n_seq_max
        cp.n_threads = params.n_threads
        cp.n_threads_batch = params.n_threads
        cp.kv_unified = params.kv_unified
        cp.flash_attn_type = params.flash_attn_type
        cp.no_perf = True
        self.params = params
        self.ptr = lib.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise BevyError(
                f"llama.cpp could not create a context (n_ctx={params.n_ctx}, n_seq_max={params.n_seq_max})"
            )
        self.memory = lib.llama_get_memory(self.ptr)
        self.batch = lib.llama_batch_init(params.n_batch, 0, 1)
        self.explain_failure: Callable[[], str] | None = None  # set by whoever installs a hook
        self.hook: Hook | None = None  # the libbevy hook serving this context, if any
        self._embd_batch = None  # a batch of hidden states, for layer-range calls
        self._embd: np.ndarray | None = None  # a view of its embd rows
        self._decode_layers = None

    def set_threads(self, n_threads: int) -> None:
        """The threads its next decodes compute on (llama_set_n_threads: batch and single alike)."""
        self.lib.llama_set_n_threads(self.ptr, n_threads, n_threads)

    def _fill(self, b: object, rows: list[tuple[int, int, int, bool]], tokens: bool) -> list[int]:
        """Write (token, pos, seq_id, wants_output) rows into batch b; returns the output rows."""
        outputs = []
        for i, (tok, pos, seq, out) in enumerate(rows):
            if tokens:
                b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
            if out:
                outputs.append(i)
        b.n_tokens = len(rows)
        return outputs

    def _check_size(self, n: int) -> None:
        if n > self.params.n_batch:
            raise BevyError(f"batch of {n} tokens exceeds n_batch={self.params.n_batch}")

    def _failed(self, what: str, rc: int, n: int) -> BevyError:
        why = self.explain_failure() if self.explain_failure else ""
        return BevyError(f"{what} failed with code {rc} ({n} tokens){': ' + why if why else ''}")

    def decode(self, tokens: list[tuple[int, int, int, bool]]) -> list[int]:
        """Decode (token, pos, seq_id, wants_logits) rows as one batch; returns the output rows."""
        self._check_size(len(tokens))
        outputs = self._fill(self.batch, tokens, tokens=True)
        rc = self.lib.llama_decode(self.ptr, self.batch)
        if rc != 0:
            raise self._failed("llama_decode", rc, len(tokens))
        return outputs

    def decode_layers(self, rows: list[tuple[int, int, int, bool]], hidden: list[np.ndarray] | None,
                      il_begin: int, il_end: int, lookahead: bool, reuse: bool) -> None:
        """Decode layers [il_begin, il_end) (+ the lookahead's attention and router) of rows
        (token, pos, seq_id, wants_output) (patched libllama: llama_decode_layers). A partial range
        ends with the lookahead and outputs, per row, its layer's FFN input (the attention it ran,
        plus the residual); a call with reuse takes that as hidden (blocks of [rows, n_embd], in
        row order) in place of the tokens and starts after layer il_begin's attention."""
        if self._decode_layers is None:
            from bevy_gguf._native import llama_ext

            self._decode_layers = llama_ext.decode_layers_fn(self.lib)
        self._check_size(len(rows))
        if hidden is None:
            b = self.batch
        else:
            if self._embd_batch is None:
                self._embd_batch = self.lib.llama_batch_init(self.params.n_batch, self.model.n_embd, 1)
                shape = (self.params.n_batch, self.model.n_embd)
                self._embd = np.ctypeslib.as_array(self._embd_batch.embd, shape=shape)
            b, at = self._embd_batch, 0
            for block in hidden:  # straight into the batch: no concatenation
                self._embd[at: at + len(block)] = block
                at += len(block)
            if at != len(rows):
                raise BevyError(f"{at} hidden states for {len(rows)} rows")
        self._fill(b, rows, tokens=hidden is None)
        rc = self._decode_layers(self.ptr, b, il_begin, il_end, lookahead, reuse)
        if rc != 0:
            raise self._failed(f"llama_decode_layers [{il_begin}, {il_end})", rc, len(rows))

    def hidden(self, n: int) -> np.ndarray:
        """[n, n_embd] hidden states output by a partial layer-range call."""
        ptr = self.lib.llama_get_embeddings(self.ptr)
        if not ptr:
            raise BevyError("no hidden states: the last call was not a partial layer range")
        return np.ctypeslib.as_array(ptr, shape=(n, self.model.n_embd)).copy()

    def logits(self, row: int) -> np.ndarray:
        ptr = self.lib.llama_get_logits_ith(self.ptr, row)
        if not ptr:
            raise BevyError(f"no logits for batch row {row}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    def seq_rm(self, seq: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def close(self) -> None:
        if self.ptr:
            self.lib.llama_batch_free(self.batch)
            if self._embd_batch is not None:
                self.lib.llama_batch_free(self._embd_batch)
            self.lib.llama_free(self.ptr)
            self.ptr = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
