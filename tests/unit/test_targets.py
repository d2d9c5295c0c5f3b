"""The targets a bench run's ratios are judged against (bench/targets.py)."""

from __future__ import annotations

import pytest

from bevy_gguf.bench.report import _balance_lines
from bevy_gguf.bench.targets import measured_ratios


def _row(system: str, cache: float, tok_per_s: float, compute_s: float, link_s: float, nbytes: float) -> dict:
    return {"system": system, "cache": cache, "link_point": "file", "tok_per_s": tok_per_s,
            "repeats": [tok_per_s, tok_per_s], "compute_busy_s": compute_s, "compute_used_s": compute_s,
            "link_busy_s": link_s,
            "bytes_loaded": nbytes, "tpot_p99_ms": 100.0 if system == "bevy" else 80.0, "ttft_ms": 50.0}


def _ratios(blocking_link_s: float, bevy_compute_s: float, bevy_bytes: float) -> dict:
    runs = [_row("blocking", 50.0, 100.0, 2.0, blocking_link_s, 1e9),
            _row("prefetch", 50.0, 100.0, 2.0, blocking_link_s, 1e9),
            _row("bevy", 50.0, 130.0, bevy_compute_s, 1.0, bevy_bytes)]
    return {r.name: r for r in measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})}


def test_where_blockings_link_and_compute_balance_runahead_must_pay() -> None:
    balanced = _ratios(blocking_link_s=2.4, bevy_compute_s=2.0, bevy_bytes=1e9)  # link / compute 1.2
    assert balanced["bevy / blocking"].target == 1.4 and balanced["bevy / blocking"].met is False
    assert balanced["bevy / prefetch"].target == 1.3 and balanced["bevy / prefetch"].met is True
    compute_bound = _ratios(blocking_link_s=0.4, bevy_compute_s=2.0, bevy_bytes=1e9)  # 0.2: never slower only
    assert compute_bound["bevy / blocking"].target == 1.0 and compute_bound["bevy / blocking"].met is True


def test_bevys_compute_and_bytes_beside_blockings_have_ceilings() -> None:
    r = _ratios(blocking_link_s=1.0, bevy_compute_s=2.4, bevy_bytes=0.9e9)
    compute, nbytes = r["bevy compute used / blocking's"], r["bevy bytes loaded / blocking's"]
    assert compute.value == pytest.approx(1.2) and compute.target == 1.15 and compute.met is False
    assert nbytes.value == pytest.approx(0.9) and nbytes.target == 1.0 and nbytes.met is True
    assert compute.as_json()["at_most"] is True
    tpot, ttft = r["bevy TPOT p99 / blocking's"], r["bevy TTFT p50 / blocking's"]
    assert tpot.value == pytest.approx(1.25) and tpot.target == 1.1 and tpot.met is False
    assert ttft.value == pytest.approx(1.0) and ttft.met is True


def test_the_report_says_which_points_are_balanced() -> None:
    runs = [_row("blocking", 25.0, 50.0, 2.0, 5.0, 1e9) | {"pct_of_bound": None},
            _row("blocking", 50.0, 100.0, 2.0, 2.2, 1e9) | {"pct_of_bound": None}]
    lines = _balance_lines({"runs": runs}, sweep=False)
    assert "Where runahead should win" in lines[1]
    assert lines[-2:] == ["| 25% | 2.50 | link-bound |", "| 50% | 1.10 | balanced |"]


def test_ttft_pairs_up_request_by_request() -> None:
    """The paired TTFT ratio takes, per repeat, the median of bevy's over blocking's TTFT of the
    same requests (those both windows hold), then the median and range over the repeats: two
    requests moving across a bimodal p50 do not move it."""
    blocking = _row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9) | {"ttft_by_request": [
        {"8": 100.0, "9": 500.0, "10": 100.0, "11": 400.0}, {"8": 100.0, "9": 500.0, "10": 200.0}]}
    bevy = _row("bevy", 50.0, 130.0, 2.0, 1.0, 1e9) | {"ttft_by_request": [
        {"8": 110.0, "9": 550.0, "10": 600.0, "12": 10.0}, {"8": 120.0, "9": 600.0, "10": 240.0}]}
    report = {"protocol": {"repeats": 2}, "runs": [blocking, bevy], "bound": []}
    paired = {r.name: r for r in measured_ratios(report)}["bevy TTFT / blocking's, request by request"]
    assert paired.value == pytest.approx((1.1 + 1.2) / 2)  # repeat 1: 1.1, 1.1, 6.0 (12 unpaired); repeat 2: 1.2
    assert (paired.low, paired.high) == (pytest.approx(1.1), pytest.approx(1.2))
    assert paired.target is None
    without = {"protocol": {"repeats": 2}, "runs": [_row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9), bevy], "bound": []}
    assert "bevy TTFT / blocking's, request by request" not in {r.name for r in measured_ratios(without)}


def test_lanes_compute_is_judged_by_the_share_of_the_threads_they_used() -> None:
    runs = [_row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9), _row("bevy", 50.0, 130.0, 3.6, 1.0, 1e9)]
    runs[1]["compute_used_s"] = 2.2  # two lanes: a graph computing 3.6 s, both at once a fifth of it
    r = {x.name: x for x in measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})}
    assert r["bevy compute used / blocking's"].value == pytest.approx(1.1)
    assert r["bevy compute used / blocking's"].met is True


def test_bytes_and_compute_are_compared_per_decode_token_where_the_windows_count_them() -> None:
    runs = [_row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9), _row("bevy", 50.0, 130.0, 2.0, 1.0, 1e9)]
    runs[0]["decode_tokens"], runs[1]["decode_tokens"] = 2000, 1600  # the same bytes for fewer tokens
    r = {x.name: x for x in measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})}
    assert r["bevy bytes loaded / blocking's"].value == pytest.approx(1.25)
    assert r["bevy bytes loaded / blocking's"].met is False
    assert r["bevy compute used / blocking's"].value == pytest.approx(1.25)  # 2.0 s for fewer tokens


def test_a_missed_target_comes_with_what_bevy_measured_at_its_point() -> None:
    from bevy_gguf.bench.report import _missed_lines

    runs = [_row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9), _row("bevy", 50.0, 90.0, 2.0, 1.0, 1.5e9)]
    runs[0] |= {"decode_tokens": 1000, "link_utilization": 0.5}
    runs[1] |= {"decode_tokens": 1000, "link_utilization": 0.9, "lanes": [2, 2], "python_per_call_ms": 1.0,
                "layer_calls": 500, "window_s": 5.0}
    report = {"protocol": {"repeats": 2, "threads": 2, "decode_tokens": 1000}, "runs": runs,
              "bound": [{"cache": 50.0, "link_point": "file", "belady_bytes": 0.5e9}]}
    lines = _missed_lines(report, measured_ratios(report), sweep=False)
    # missed: slower than blocking, more bytes, a slower TPOT p99 (100 against 80 ms)
    assert lines[-1] == "| 50% | 3 | 0.90 / 0.50 | 1.50 / 3.00 | 1.00 | 10% | 1 of 2 |"
    runs[1] |= {"tok_per_s": 130.0, "repeats": [130.0, 130.0], "bytes_loaded": 1e9}
    runs[1]["tpot_p99_ms"] = runs[0]["tpot_p99_ms"]
    assert _missed_lines(report, measured_ratios(report), sweep=False) == []  # every target met


def test_a_serving_streams_bytes_are_judged_over_the_whole_run() -> None:
    """The whole runs of a stream did the same work, so their bytes carry the ceiling; the
    window's per decode token (whose decode tokens differ by system) is kept as a diagnosis."""
    runs = [_row("blocking", 50.0, 100.0, 2.0, 1.0, 1e9), _row("bevy", 50.0, 130.0, 2.0, 1.0, 1e9)]
    runs[0] |= {"decode_tokens": 2000, "run_bytes_loaded": 4e9}
    runs[1] |= {"decode_tokens": 1600, "run_bytes_loaded": 3.8e9}
    r = {x.name: x for x in measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})}
    whole = r["bevy bytes loaded / blocking's, whole run"]
    assert whole.value == pytest.approx(0.95) and whole.target == 1.0 and whole.met is True
    window = r["bevy bytes loaded / blocking's, per decode token of the window"]
    assert window.value == pytest.approx(1.25) and window.target is None and window.met is None
    assert "bevy bytes loaded / blocking's" not in r
    runs[1]["run_bytes_loaded"] = 4.4e9
    r = {x.name: x for x in measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})}
    assert r["bevy bytes loaded / blocking's, whole run"].met is False
