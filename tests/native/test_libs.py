"""One libllama per process, chosen before llama_cpp is imported; a test proves which."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from bevy_gguf.paths import lib_dir

SNIPPET = """
import json, sys
from bevy_gguf._native.loader import use_libllama, loaded_libllama
from bevy_gguf.errors import BevyError
lib = use_libllama(sys.argv[1])
other = "patched" if sys.argv[1] == "stock" else "stock"
try:
    use_libllama(other)
    refused = False
except BevyError:
    refused = True
print(json.dumps({"loaded": loaded_libllama(), "has_hook": hasattr(lib.llama_cpp._lib, "llama_set_moe_hook"),
                  "refused_other": refused}))
"""


@pytest.mark.parametrize("kind", ["stock", "patched"])
def test_exactly_one_libllama_is_loaded(kind: str) -> None:
    import json

    out = subprocess.run([sys.executable, "-c", SNIPPET, kind], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert len(info["loaded"]) == 1
    assert info["loaded"][0].startswith(str(lib_dir(kind).resolve()) + "/libllama.so")
    assert info["has_hook"] == (kind == "patched")
    assert info["refused_other"]


@pytest.mark.parametrize("want,ok", [("stock", True), ("patched", False)])
def test_llama_cpp_imported_first_must_match(want: str, ok: bool) -> None:
    import os

    code = f"import llama_cpp\nfrom bevy_gguf._native.loader import use_libllama\nuse_libllama({want!r})"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(lib_dir("stock")))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert (out.returncode == 0) == ok, out.stderr
    if not ok:
        assert "llama_cpp was imported before bevy_gguf chose the patched libllama" in out.stderr
