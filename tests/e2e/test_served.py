"""bench's server rows (bench/served.py): stock llama-server and bevy-gguf serve driven by one client.

Both servers answer the serving stream as stock llama.cpp answers each prompt alone, by the margin
rule (docs/correctness.md), and the client's figures are those of a serving window.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import PROBES, ROOT, run_cli, tiny_spec

from bevy_gguf.bench.served import Answer, measure, spread
from bevy_gguf.synth import ensure_model

REPLACEMENT = "\ufffd"  # llama-server sends bytes that are not UTF-8 as U+FFFD; bevy-gguf serve leaves them out
# both servers hold back bytes that may begin a UTF-8 character; those still held at the end (at
# most 3, each of which the reference's lenient decoding may keep as a character) are never sent
TAIL = 3


def test_llama_server_and_bevy_serve_answer_the_stream_as_stock_does() -> None:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    spec = {"model": str(model), "threads": 2, "parallel": 3, "requests": 8, "prompt_range": [8, 40],
            "decode_range": [8, 24], "seed": 3, "warmup": 2, "cache": "25%", "link": "file", "flash_attn": "off"}
    out = subprocess.run([sys.executable, str(PROBES / "served_probe.py"), json.dumps(spec),
                          "llama-server,bevy-server"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    reference = doc["reference"]
    for system, row in doc["runs"].items():
        assert row["finish_reasons"] == ["length"], (system, row["finish_reasons"])
        # ignore_eos: every request decoded its stream length, each token counted by timings.predicted_n
        assert row["generated"] == [r["tokens"] for r in reference], system
        for i, (answer, ref) in enumerate(zip(row["answers"], reference)):
            text = answer.replace(REPLACEMENT, "")
            if ref["trusted_tokens"] < ref["tokens"]:
                assert text.startswith(ref["trusted"]), (system, i, answer, ref)
            else:  # every token trusted: the text may lack the last token's bytes that never became UTF-8
                assert ref["trusted"].startswith(text) and len(text) >= len(ref["trusted"]) - TAIL, (system, i)
        assert row["decode_tokens"] > 0 and row["tok_per_s"] > 0 and row["ttft_ms"], system
    # the rule compared a fair share of the tokens, not only the first few
    assert sum(r["trusted_tokens"] for r in reference) >= 0.25 * sum(r["tokens"] for r in reference)
    assert "decode_counters" in doc["runs"]["bevy-server"]  # the cache's counters from /metrics
    assert doc["runs"]["bevy-server"]["decode_counters"]["misses"] > 0


def test_tokens_of_one_chunk_spread_over_its_gap() -> None:
    times: list[float] = []
    spread(times, 0.0, 1.0, 2)  # the first chunk: its tokens at once (what came before was the prompt)
    spread(times, 1.0, 2.0, 1)
    spread(times, 2.0, 4.0, 4)
    assert times == [1.0, 1.0, 2.0, 2.5, 3.0, 3.5, 4.0]


def test_a_failed_request_fails_the_run_with_its_reason() -> None:
    ok = Answer(sent=0.0, times=[1.0, 2.0], finish="length")
    bad = Answer(sent=0.0, error="HTTP 500: b'boom'")
    try:
        measure([ok, ok, bad, ok], 1, 1)
    except Exception as e:  # noqa: BLE001
        assert "1 of 4 requests failed" in str(e) and "HTTP 500" in str(e)
    else:
        raise AssertionError("a failed request was measured")


def test_server_rows_need_the_serving_stream() -> None:
    model = ensure_model(tiny_spec(layers=4, experts=16, top_k=2), progress=False)
    proc = run_cli("bench", model, "--workload", "text", "--systems", "llama-server", check=False)
    assert proc.returncode != 0 and "use it with --workload serve" in proc.stderr and "Traceback" not in proc.stderr
