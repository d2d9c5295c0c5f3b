"""The byte-level SPM vocabulary of generated models, and the byte classes the recipe reads.

Vocabulary: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, and '▁' (SPM's space). Any
UTF-8 text tokenizes (llama.cpp's SPM tokenizer falls back to bytes) and detokenizes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

SPACE_PIECE = "\u2581"  # SPM's visible space
N_SPECIAL = 3
BYTE_BASE = N_SPECIAL
SPACE_TOKEN = BYTE_BASE + 256
N_VOCAB = SPACE_TOKEN + 1

# byte classes that set a token's "topic" (docs/models.md)
CLASSES = ("lower", "upper", "digit", "space", "punct", "utf8_lead", "utf8_cont", "other")


@dataclass(frozen=True, slots=True)
class Vocab:
    tokens: list[str]
    scores: list[float]
    types: list[int]
    bos: int = 1
    eos: int = 2
    unk: int = 0


def build_vocab(size: int = N_VOCAB) -> Vocab:
    """The vocabulary, padded with unused tokens to `size` (a real model's vocabulary size)."""
    t = gguf.TokenType
    pad = size - N_VOCAB
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [SPACE_PIECE]
    tokens += [f"<unused{i}>" for i in range(pad)]
    types = [t.UNKNOWN, t.CONTROL, t.CONTROL] + [t.BYTE] * 256 + [t.NORMAL] + [t.UNUSED] * pad
    return Vocab(tokens=tokens, scores=[0.0] * size, types=[int(x) for x in types])


def byte_class(b: int) -> str:
    ch = chr(b)
    if b < 0x80:
        if ch.islower():
            return "lower"
        if ch.isupper():
            return "upper"
        if ch.isdigit():
            return "digit"
        if ch in " \t\n\r":
            return "space"
        if 0x21 <= b <= 0x7E:
            return "punct"
        return "other"
    if 0x80 <= b <= 0xBF:
        return "utf8_cont"
    if 0xC2 <= b <= 0xF4:
        return "utf8_lead"
    return "other"


def token_class(token: int) -> str:
    """The byte class of a vocabulary entry (specials are 'other', '▁' is 'space')."""
    if token == SPACE_TOKEN:
        return "space"
    if BYTE_BASE <= token < BYTE_BASE + 256:
        return byte_class(token - BYTE_BASE)
    return "other"
