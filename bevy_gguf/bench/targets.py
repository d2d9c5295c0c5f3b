"""The ratios a bench run measured, each against its target (docs/benchmark.md).

Every ratio is median over median (the systems ran interleaved, repeat by repeat); the
per-repeat range pairs the two systems' runs of the same repeat, so a verdict whose range
straddles its target is visibly within this machine's run-to-run noise.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bevy_gguf.bench.variants import base_of

NEVER_SLOWER = ("blocking", "prefetch", "bevy-ctx", "stock-offload")  # bevy / these >= 1 everywhere
RATIO_TARGETS = {  # (ratio, cache %) -> target, over the never-slower floor
    ("bevy / blocking", 90.0): 1.5,
    ("bevy / prefetch", 75.0): 1.3,
    ("bevy / prefetch", 90.0): 1.3,
    ("bevy / stock-offload", 25.0): 3.5,
    ("bevy / stock-offload", 90.0): 5.0,
    ("bevy / stock-resident", 100.0): 0.95,
}
# the server rows (bench/served.py), measured end to end by one client: bevy-gguf serve against
# stock llama-server as users run it
SERVER_TARGETS = {("bevy-server / llama-server-offload", 25.0): 3.5, ("bevy-server / llama-server", 100.0): 0.95}
BOUND_TARGET = 0.85  # bevy / bound at every cache point
# where blocking's link busy is within this range of its compute busy (the balanced region, where
# overlap can give up to 2x), runahead must pay: these targets there
BALANCED = (0.7, 1.4)
BALANCED_TARGETS = {"bevy / blocking": 1.4, "bevy / prefetch": 1.3}
# bevy's cost beside blocking's at every point: at most these (lower is better); runahead must
# not starve a lagging request, nor a prompt wait longer for its first token
# (compute used: busy seconds weighted by the share of the threads computing, so that two lanes
# on a thread each, one computing, count half the machine; blocking's is its busy time)
COST_TARGETS = {"compute_used_s": ("bevy compute used / blocking's", 1.15),
                "bytes_loaded": ("bevy bytes loaded / blocking's", 1.0),
                "tpot_p99_ms": ("bevy TPOT p99 / blocking's", 1.1),
                "ttft_ms": ("bevy TTFT p50 / blocking's", 1.0)}
# totals over a run: compared per decode token where the rows count their windows' tokens
PER_TOKEN = ("compute_used_s", "bytes_loaded")


@dataclass(frozen=True, slots=True)
class Ratio:
    name: str
    cache: float                # percent
    value: float                # median over median
    low: float | None = None    # per-repeat range (None: the repeats do not pair up)
    high: float | None = None
    target: float | None = None
    link: str | None = None     # the --link of the point (a link sweep has several)
    at_most: bool = False       # the target is a ceiling (a cost), not a floor

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value <= self.target if self.at_most else self.value >= self.target

    @property
    def within_noise(self) -> bool:
        """The repeats fall on both sides of the target."""
        return self.target is not None and self.low is not None and self.low < self.target <= self.high

    def as_json(self) -> dict[str, Any]:
        return {"ratio": self.name, "cache": self.cache, "link": self.link, "value": self.value, "low": self.low,
                "high": self.high, "target": self.target, "at_most": self.at_most, "met": self.met}


def balance(blocking: dict[str, Any] | None) -> float | None:
    """blocking's link busy over its compute busy at a point (None: not measured)."""
    if not blocking or not blocking.get("compute_busy_s") or blocking.get("link_busy_s") is None:
        return None
    return blocking["link_busy_s"] / blocking["compute_busy_s"]


def is_balanced(value: float | None) -> bool:
    return value is not None and BALANCED[0] <= value <= BALANCED[1]


def target_of(name: str, cache: float, balanced: bool = False) -> float | None:
    """The target of a ratio at a cache point (percent; 89.99999 is the 90% point), the higher
    one where blocking's link and compute balance."""
    key = (name, float(round(cache)))
    if balanced and name in BALANCED_TARGETS:
        return max(BALANCED_TARGETS[name], RATIO_TARGETS.get(key, 0.0))
    if key in RATIO_TARGETS:
        return RATIO_TARGETS[key]
    if name == "bevy / bound":
        return BOUND_TARGET
    return 1.0 if name.removeprefix("bevy / ") in NEVER_SLOWER else None


def _paired(a: list[float | None], b: list[float | None], repeats: int) -> tuple[float | None, float | None]:
    """min and max of a[i] / b[i] over the repeats, when both ran every repeat."""
    if len(a) != repeats or len(b) != repeats or not all(a) or not all(b):
        return None, None
    ratios = [x / y for x, y in zip(a, b)]
    return min(ratios), max(ratios)


def measured_ratios(report: dict[str, Any]) -> list[Ratio]:
    """bevy against every other system at each point (cache, link) of the sweep, bevy at 100%
    against stock-resident, and bevy against the bound and the online bound; points in order;
    then each variant against its base system.
    Stock systems have no link: their rows serve every link point of their cache, except that
    stock-offload (mmap from the disk) is only compared where bevy's link is not emulated."""
    repeats = report.get("protocol", {}).get("repeats", 0)
    rows = {(r["system"], r["cache"], r.get("link_point")): r for r in report["runs"] if r.get("tok_per_s")}
    bounds = {(b["cache"], b.get("link_point")): b for b in report.get("bound", [])}
    out: list[Ratio] = []
    points = list(dict.fromkeys((c, link) for s, c, link in rows if s == "bevy"))
    for cache, link in sorted(points, key=lambda p: p[0]):
        bevy = rows[("bevy", cache, link)]
        balanced = is_balanced(balance(rows.get(("blocking", cache, link))))
        others = [(o, cache, link) for o in NEVER_SLOWER if o != "stock-offload"]
        if not (link or "").startswith("throttle"):
            others.append(("stock-offload", cache, None))
        if round(cache) == 100:
            others.append(("stock-resident", 100.0, None))
        for key in others:
            if key not in rows:
                continue
            name = f"bevy / {key[0]}"
            low, high = _paired(bevy.get("repeats", []), rows[key].get("repeats", []), repeats)
            out.append(Ratio(name, cache, bevy["tok_per_s"] / rows[key]["tok_per_s"], low, high,
                             target_of(name, cache, balanced), link))
        out += _cost_ratios(bevy, rows.get(("blocking", cache, link)), cache, link)
        out += _ttft_by_request(bevy, rows.get(("blocking", cache, link)), cache, link)
        b = bounds.get((cache, link), {})
        for name, limit in (("bevy / bound", b.get("tok_per_s")), ("bevy / online bound", b.get("online_tok_per_s"))):
            if limit:  # the online bound is a reference: no target
                runs = bevy.get("repeats", [])
                low, high = _paired(runs, [limit] * len(runs), repeats)
                out.append(Ratio(name, cache, bevy["tok_per_s"] / limit, low, high, target_of(name, cache), link))
    return out + _server_ratios(rows, repeats) + _variant_ratios(rows, repeats)


def _server_ratios(rows: dict[tuple[str, float, str | None], dict[str, Any]], repeats: int) -> list[Ratio]:
    """bevy-gguf serve against stock llama-server at each point: against llama-server-offload at
    every cache point (where its link is not emulated; never slower, 3.5x at 25%), against
    llama-server (every weight in memory) at 100% (0.95x); and against in-process bevy at the same
    point, the cost of serving over HTTP (no target)."""
    out = []
    for (system, cache, link), row in sorted(rows.items(), key=lambda kv: kv[0][1]):
        if system != "bevy-server":
            continue
        others = [("bevy", cache, link)]
        if not (link or "").startswith("throttle"):
            others.append(("llama-server-offload", cache, None))
        if round(cache) == 100:
            others.append(("llama-server", 100.0, None))
        for key in others:
            if key not in rows:
                continue
            name = f"bevy-server / {key[0]}"
            target = SERVER_TARGETS.get((name, float(round(cache))))
            if target is None and key[0] == "llama-server-offload":
                target = 1.0
            low, high = _paired(row.get("repeats", []), rows[key].get("repeats", []), repeats)
            out.append(Ratio(name, cache, row["tok_per_s"] / rows[key]["tok_per_s"], low, high, target, link))
    return out


def per_token(row: dict[str, Any] | None, key: str) -> float | None:
    """A run's total over its window per decode token (None where either is missing)."""
    if not row or row.get(key) is None or not row.get("decode_tokens"):
        return None
    return row[key] / row["decode_tokens"]


def _cost_ratios(bevy: dict[str, Any], blocking: dict[str, Any] | None, cache: float, link: str | None) -> list[Ratio]:
    """bevy's compute used and bytes loaded (per decode token where the rows count their windows'
    tokens), TPOT p99 and TTFT p50 over blocking's at a point (medians; no per-repeat range: the
    rows keep only each repeat's tok/s), each against its ceiling."""
    out = []
    whole = (bevy.get("run_bytes_loaded"), (blocking or {}).get("run_bytes_loaded"))
    for key, (name, ceiling) in COST_TARGETS.items():
        mine, theirs = bevy.get(key), (blocking or {}).get(key)
        if key in PER_TOKEN and None not in (pair := (per_token(bevy, key), per_token(blocking, key))):
            mine, theirs = pair  # per decode token: serving windows hold different numbers of decode tokens
        if key == "bytes_loaded" and whole[0] is not None and whole[1]:
            # a serving stream: the whole runs did the same work, the windows not quite (they
            # hold the same prompts but not the same decode tokens), so the window's is a diagnosis
            out.append(Ratio(f"{name}, whole run", cache, whole[0] / whole[1], target=ceiling, link=link,
                             at_most=True))
            name, ceiling = f"{name}, per decode token of the window", None
        if mine is not None and theirs:
            out.append(Ratio(name, cache, mine / theirs, target=ceiling, link=link, at_most=True))
    return out


def _ttft_by_request(bevy: dict[str, Any], blocking: dict[str, Any] | None, cache: float, link: str | None
                     ) -> list[Ratio]:
    """bevy's TTFT over blocking's request by request (the same request index is the same text in
    both): per repeat the median of the paired ratios, then the median and range over repeats. A
    diagnosis beside the p50 ceiling, no target of its own: a serving window's TTFTs are few and
    split between short and long prompts, so their p50 can jump between the two groups when one
    request moves (measured: p50s 1.39x apart while the paired ratios' median was 1.09x)."""
    medians = []
    for mine, theirs in zip(bevy.get("ttft_by_request") or [], (blocking or {}).get("ttft_by_request") or []):
        ratios = [mine[i] / theirs[i] for i in mine.keys() & theirs.keys() if theirs[i] > 0]
        if ratios:
            medians.append(statistics.median(ratios))
    if not medians:
        return []
    return [Ratio("bevy TTFT / blocking's, request by request", cache, statistics.median(medians),
                  min(medians), max(medians), None, link)]


def _variant_ratios(rows: dict[tuple[str, float, str | None], dict[str, Any]], repeats: int) -> list[Ratio]:
    """Each variant (bench/variants.py) over its base system at the same point: an A/B, no target."""
    out = []
    for (system, cache, link), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = rows.get((base_of(system), cache, link))
        if base_of(system) != system and base:
            low, high = _paired(row.get("repeats", []), base.get("repeats", []), repeats)
            out.append(Ratio(f"{system} / {base_of(system)}", cache, row["tok_per_s"] / base["tok_per_s"],
                             low, high, None, link))
    return out


def verdict(r: Ratio) -> str:
    if r.met is None:
        return ""
    text = "met" if r.met else "missed"
    return text + " (repeats on both sides)" if r.within_noise else text
