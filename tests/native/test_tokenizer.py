"""The generated models' SPM byte-level tokenizer handles any UTF-8 text, in stock llama.cpp."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

TEXTS = ["Hello, world!", "  two  spaces\tand\ttabs\nnewline", "Grüß Gott — naïve café", "你好，世界",
         "Здравствуй, мир", "emoji 🚀🧪", "mixed: x=3.14; y=[1,2]"]

SNIPPET = """
import json, sys
from bevy_gguf._native.loader import use_libllama
from bevy_gguf._native.llama_handles import Model
texts = json.loads(sys.stdin.read())
with Model(use_libllama("stock"), sys.argv[1]) as m:
    print(json.dumps([[m.tokenize(t), m.detokenize(m.tokenize(t))] for t in texts]))
"""


def test_utf8_round_trip(qwen3_tiny: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SNIPPET, str(qwen3_tiny)], input=json.dumps(TEXTS),
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    for text, (tokens, back) in zip(TEXTS, json.loads(out.stdout)):
        assert back == text
        assert tokens[0] == 1  # BOS
        assert len(tokens) - 1 <= len(text.encode())  # bytes, spaces as one '▁' token
