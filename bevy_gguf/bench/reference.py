"""The reference routing of a bench workload, recorded in its own (patched) process.

usage: python -m bevy_gguf.bench.reference MODEL REQUESTS PROMPT_TOKENS STEPS THREADS
Prints {"prefill": [[layer, experts]...], "decode": [[layer, experts]...]}: the visits of the
blocking order. Teacher forcing makes the routing the same for every system.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bevy_gguf.analysis.replay import blocking_order
from bevy_gguf.analysis.trace import trace_workload


def main() -> int:
    model, requests, prompt_tokens, steps, threads = sys.argv[1], *map(int, sys.argv[2:6])
    sel, _, prefill = trace_workload(Path(model), requests, prompt_tokens, steps, threads, with_prefill=True)
    print(json.dumps({"prefill": prefill, "decode": blocking_order(sel)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
