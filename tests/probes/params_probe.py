"""Prints stock llama.cpp's parameter count of each model given, as JSON {path: n_params} (for the tests).

usage: params_probe.py MODEL...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf._native.llama_handles import Model
from bevy_gguf._native.loader import use_libllama

if __name__ == "__main__":
    llama_cpp = use_libllama("stock")
    counts = {}
    for path in sys.argv[1:]:
        with Model(llama_cpp, Path(path)) as model:
            counts[path] = int(llama_cpp.llama_model_n_params(model.ptr))
    print(json.dumps(counts))
