"""Bench outputs: report.md, report.json, throughput(_link).png, working_set.png, timeline.json (Chrome/Perfetto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bevy_gguf._native import libbevy as native
from bevy_gguf.bench.targets import BALANCED, balance, is_balanced, measured_ratios, per_token, verdict
from bevy_gguf.workload.serving import DECODE_TOKENS, PROMPT_TOKENS, serve_range

TARGETS = "docs/benchmark.md"


SERVE_WINDOW_NOTE = (" (tok/s, TPOT, TTFT, hit rate, bytes and busy times counted inside each run's steady-state "
                     "window, bench/window.py; layer calls, the cost model and runahead's epochs are the whole run's).")


def _fmt(value: Any, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else 1e6 * seconds


def _link_cell(link: str | None) -> str:
    """A link point as a table cell: the throttle's rate, or the link as given."""
    if link and link.startswith("throttle:"):
        return f"{link.split(':')[1]} (emulated)"
    return link or "-"


def markdown(report: dict[str, Any], command: str) -> str:
    p = report["protocol"]
    sweep = len({r.get("link_point") for r in report["runs"] if r.get("link_point")}) > 1  # a link column
    link = next((r["link"] for r in report["runs"] if r.get("link")), p["link"])
    if sweep:
        links = list(dict.fromkeys(r["link"] for r in report["runs"] if r.get("link") and r.get("link_point")))
        link = "swept: " + "; ".join(links)
    elif link.startswith("file (O_DIRECT)"):
        bounced = any(r.get("link_bounced") for r in report["runs"])
        link += ", experts through a bounce buffer (unaligned)" if bounced else ", experts read straight into slots"
    lines = [
        "# bevy-gguf bench",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {p['machine']}. Model: `{Path(p['model']).name}` ({p['model_bytes'] / 1e6:.0f} MB, "
        f"{p['expert_bytes'] / 1e6:.0f} MB of routed experts, {p['slot_bytes'] / 1e3:.0f} kB per expert).",
        f"Workload: {_workload(p)}, --parallel {p['parallel']}, {p['threads']} threads. Link: {link}"
        + (f", measured {p['link_rate_bytes_per_s'] / 1e9:.2f} GB/s" if p.get("link_rate_bytes_per_s") and not sweep
           else "")
        + f". {p['repeats']} runs per row (median), systems interleaved, cold cache per run"
        + (SERVE_WINDOW_NOTE if p["workload"] == "serve" else "."),
        "Weight layouts: stock-resident as stock runs by default (repackable weights, e.g. Q4_0 and Q4_K "
        "on AVX2, copied into ggml-cpu's interleaved layouts); stock-offload with --no-repack (every weight "
        "read through the mapping); bevy-gguf's dense weights as stock-resident's, and its cache slots "
        "in the same repacked layout where stock repacks (the rest the file's bytes)" + _repacked(report) + ".",
        _placement(p),
        *_servers(report),
        "",
        "| system | cache | " + ("link | " if sweep else "") + "tok/s | % of bound | TPOT p50 / p99 ms | TTFT ms | "
        "hit rate | MB loaded (whole run) | compute busy (used) / link busy s | link util | link GB/s while busy | "
        "overlap eff. | layer calls (two-pass) | status |",
        "|---|---|" + ("---|" if sweep else "") + "---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        status = r.get("status", "")
        if r.get("memory_cap"):
            status += f" ({r['memory_cap']})"
        link = f"{_link_cell(r.get('link_point'))} | " if sweep else ""
        lines.append(
            f"| {r['system']} | {r['cache']:.0f}% | {link}{_fmt(r['tok_per_s'])} | "
            f"{_fmt(r['pct_of_bound'] and 100 * r['pct_of_bound'], '.0f')} | "
            f"{_fmt(r['tpot_p50_ms'])} / {_fmt(r['tpot_p99_ms'])} | {_fmt(r['ttft_ms'], '.0f')} | "
            f"{_fmt(r['hit_rate'], '.3f')} | {_fmt(r['bytes_loaded'] and r['bytes_loaded'] / 1e6, '.0f')}"
            f"{_whole_mb(r)} | "
            f"{_fmt(r.get('compute_busy_s'), '.2f')} ({_fmt(r.get('compute_used_s'), '.2f')}) / "
            f"{_fmt(r.get('link_busy_s'), '.2f')} | "
            f"{_fmt(r.get('link_utilization'), '.2f')} | "
            f"{_fmt(r.get('link_bytes_per_s') and r['link_bytes_per_s'] / 1e9, '.2f')} | "
            f"{_fmt(r['overlap_efficiency'], '.2f')} | {_calls(r)} | {status} |")
    policy = next((b.get("online_policy") for b in report["bound"]), None) or "next-use"
    lines += ["", "Bound per point (the larger of the compute time, the fastest decode measured with every "
              "expert in memory, stock-resident or any system at a 100% cache, and the link time of Belady's "
              f"optimal misses of the recorded order); the online bound puts the misses of `{policy}` (the "
              "live cache's eviction) replayed on that order in place of Belady's (a reference, not a limit: "
              "a scheduler whose lookahead reveals part of the future can load less):", "",
              "| cache | " + ("link | " if sweep else "") + f"bound tok/s | Belady misses | compute s | link s | "
              f"{policy} misses | online bound tok/s |",
              "|---|" + ("---|" if sweep else "") + "---|---|---|---|---|---|"]
    for b in report["bound"]:
        link = f"{_link_cell(b.get('link_point'))} | " if sweep else ""
        lines.append(f"| {b['cache']:.0f}% | {link}{_fmt(b['tok_per_s'])} | {_fmt(b['belady_misses'], 'd')} | "
                     f"{_fmt(b['compute_s'], '.2f')} | {_fmt(b['link_s'], '.2f')} | "
                     f"{_fmt(b.get('online_misses'), 'd')} | {_fmt(b.get('online_tok_per_s'))} |")
    lines += _balance_lines(report, sweep)
    notes = sorted({b["note"] for b in report["bound"] if b.get("note")})
    lines += [""] + [f"{n[0].upper()}{n[1:]}." for n in notes] if notes else []
    fits = [r for r in report["runs"] if r.get("cost_model")]
    if fits:
        lines += ["", "The call cost model each lane of `bevy` fitted on this machine (last run of each point; "
                  "compute seconds of a layer-range call = fixed + per layer + per token-layer + per expert read "
                  "+ per attended position-layer + per MoE layer in two passes + per expert load landing while "
                  "it computes; the two-pass cost fitted once calls of both kinds were seen, the start-up "
                  "calibration's, with every expert resident, beside it), and the link's time per expert load: as the "
                  "run's loads came, and at start-up with nothing computing and beside a call:", "",
                  "| cache | " + ("link | " if sweep else "") + "lanes (per run) | 1, 2, ... lanes ms (layers timed) | "
                  "lane | calls | fixed µs | per layer µs | per token-layer µs | per expert µs | "
                  "per 1k positions-layer µs | two-pass layer µs, fitted / calibrated | per load beside µs | "
                  "link ms per load: running / alone / beside a call (start-up) |",
                  "|---|" + ("---|" if sweep else "") + "---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in fits:
            link = f"{_link_cell(r.get('link_point'))} | " if sweep else ""
            lanes = ", ".join(str(k) for k in r.get("lanes") or []) or "-"
            secs = r.get("lane_seconds") or {}
            timing = " / ".join(f"{1e3 * v:.2f}" for _, v in sorted(secs.items(), key=lambda kv: int(kv[0]))) or "-"
            if secs and r.get("lane_layers"):
                timing += f" ({r['lane_layers']} layers)"
            for lane, m in enumerate(r["cost_model"]):
                lines.append(f"| {r['cache']:.0f}% | {link}{lanes} | {timing} | {lane} | {m['calls']} | "
                             f"{1e6 * m['fixed']:.0f} | "
                             f"{1e6 * m['per_layer']:.0f} | {1e6 * m['per_token_layer']:.1f} | "
                             f"{1e6 * m['per_expert']:.1f} | {1e9 * m['per_context_layer']:.1f} | "
                             f"{_fmt(_us(m.get('two_pass_overhead')))} / {_fmt(_us(r.get('two_pass_overhead_s')))} | "
                             f"{_fmt(_us(m.get('per_load_beside')))} | "
                             f"{_fmt(r.get('load_s') and 1e3 * r['load_s'], '.2f')} / "
                             f"{_fmt(r.get('load_alone_s') and 1e3 * r['load_alone_s'], '.2f')} / "
                             f"{_fmt(r.get('load_beside_s') and 1e3 * r['load_beside_s'], '.2f')} |")
    lines += _runahead_table(report, sweep)
    touched, n_experts = p.get("touched_experts"), p.get("n_experts")
    if touched and n_experts:
        lines += ["", f"The recorded order touches {touched} of the {n_experts} experts "
                  f"({100 * touched / n_experts:.1f}%): a cache point at or above that sees cold misses only."]
    lines += _working_set_lines(p)
    ratios = measured_ratios(report)
    if ratios:
        lines += ["", f"Ratios measured in this run, against their targets ({TARGETS}); per repeat: the lowest and "
                  "highest ratio of the two systems' runs in the same repeat:", "",
                  "| ratio | cache | " + ("link | " if sweep else "") + "value | per repeat | target | verdict |",
                  "|---|---|" + ("---|" if sweep else "") + "---|---|---|---|"]
        for r in ratios:
            spread = f"{r.low:.2f}–{r.high:.2f}" if r.low is not None else "-"
            target = f"{'≤' if r.at_most else '≥'} {r.target:g}" if r.target is not None else "-"
            link = f"{_link_cell(r.link)} | " if sweep else ""
            lines.append(f"| {r.name} | {r.cache:.0f}% | {link}{r.value:.2f} | {spread} | {target} | {verdict(r)} |")
        lines += _missed_lines(report, ratios, sweep)
    tok_s = ("decode outputs inside the steady-state window / its length (the joiners' prefill runs inside it, "
             "as on a server; TTFT from admission, of the requests admitted inside it)" if p["workload"] == "serve"
             else "decode tokens / decode wall time (prefill excluded, TTFT apart)")
    lines += ["", f"Definitions: tok/s = {tok_s}; compute busy ="
              " time at least one graph computes; compute used = that time weighted by the share of the threads "
              "computing (lanes); link busy = time at least one transfer is in flight; overlap "
              "efficiency = max(compute busy, link busy) / decode wall time.", ""]
    return "\n".join(lines)


def _servers(report: dict[str, Any]) -> list[str]:
    """What the server rows are (bench/served.py), where the run has any."""
    from bevy_gguf.bench.served import SERVER_SYSTEMS

    ran = [s for s in SERVER_SYSTEMS if any(r["system"] == s for r in report["runs"])]
    if not ran:
        return []
    return [f"Servers ({', '.join(ran)}): stock llama-server built from the pinned source (-np = --parallel, "
            "continuous batching, a KV stream per sequence; -offload: mmap, --no-repack, the server alone in "
            "the memory cgroup) and bevy-gguf serve (--scheduler bevy, the point's cache and link), on loopback, "
            "driven by one closed-loop client on this machine with the same stream, streamed, greedy (not "
            "teacher-forced: each server decodes its own tokens), tokens counted by timings.predicted_n; "
            "the bound's compute term leaves them out."]


def _placement(p: dict[str, Any]) -> str:
    """Where the weights and the expert cache lived (-ngl, --device)."""
    store = (f"bevy-gguf's expert cache in the memory of ggml device {p['device']} (a device buffer, filled "
             "by the link workers through ggml_backend_tensor_set)") if p.get("device") else \
        "bevy-gguf's expert cache in host memory"
    return f"Placement: -ngl {p.get('gpu_layers', 0)} for every system; {store}."


def _repacked(report: dict[str, Any]) -> str:
    """How many expert tensors bevy-gguf's runs served from repacked slots, as they reported it."""
    seen = sorted({tuple(r["repacked_expert_tensors"]) for r in report["runs"] if r.get("repacked_expert_tensors")})
    return f": {seen[0][0]} of {seen[0][1]} expert tensors repacked" if len(seen) == 1 else ""


def _workload(p: dict[str, Any]) -> str:
    """The protocol's workload, in words."""
    if p["workload"] == "serve":
        lo_p, lo_d = serve_range(PROMPT_TOKENS, p["prompt_tokens"])[0], serve_range(DECODE_TOKENS, p["steps"])[0]
        return (f"serve (a closed-loop stream of {p['requests']} teacher-forced texts, prompts of {lo_p}-"
                f"{p['prompt_tokens']} tokens and {lo_d}-{p['steps']} decode steps, log-uniform, seed {p['seed']}; "
                f"the window runs from the {p['warmup'] or p['parallel']}th finish to the drain)")
    kind = "teacher-forced texts" if p["workload"] == "text" else "greedy generation"
    return f"{p['workload']} ({kind}), {p['requests']} requests, {p['prompt_tokens']}-token prompts, " \
           f"{p['steps']} decode steps each"


def _runahead_table(report: dict[str, Any], sweep: bool) -> list[str]:
    """What each bevy run measured of runahead (engine/runahead.py): its epochs with it and
    without (groups whole), and each mode's rate in token-layers per second."""
    rows = [r for r in report["runs"] if r.get("runahead")]
    if not rows:
        return []
    lines = ["", "Runahead as each run of `bevy` measured it (engine/runahead.py: epochs of about three steps, "
             "the first unmeasured, with runahead and with groups kept whole in turn, then the faster; per run: "
             "epochs on / whole, and each mode's rate in k token-layers/s), and the step loop's Python per "
             "layer-range call (median of the runs: scheduling, hidden states, crossings; what a split costs "
             "beyond the call itself):", "",
             "| system | cache | " + ("link | " if sweep else "") + "epochs on / whole | k token-layers/s on / whole | "
             "Python ms per call |",
             "|---|---|" + ("---|" if sweep else "") + "---|---|---|"]
    for r in rows:
        link = f"{_link_cell(r.get('link_point'))} | " if sweep else ""
        epochs = ", ".join(f"{m['runahead_epochs']} / {m['whole_epochs']}" for m in r["runahead"])
        rates = ", ".join(f"{_fmt(m['runahead_rate'] and m['runahead_rate'] / 1e3, '.2f')} / "
                          f"{_fmt(m['whole_rate'] and m['whole_rate'] / 1e3, '.2f')}" for m in r["runahead"])
        lines.append(f"| {r['system']} | {r['cache']:.0f}% | {link}{epochs} | {rates} | "
                     f"{_fmt(r.get('python_per_call_ms'), '.2f')} |")
    return lines


def _calls(row: dict[str, Any]) -> str:
    """bevy's layer-range calls and, of them, those with two passes (medians); '-' for the others."""
    if row.get("layer_calls") is None:
        return "-"
    return f"{row['layer_calls']:.0f} ({_fmt(row.get('two_pass_calls'), '.0f')})"


def _link_rate(link: str | None) -> float | None:
    from bevy_gguf.config import LinkSpec

    return LinkSpec.parse(link).rate if link else None


def plot(report: dict[str, Any], path: Path) -> list[str]:
    """Decode throughput against the cache size: a line per system (per system and link point
    where the sweep has several), stock-resident and llama-server (every weight in memory) as
    horizontal lines, and the bound (of the bench's first link point). Returns the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    links = list(dict.fromkeys(r["link_point"] for r in report["runs"] if r.get("link_point")))
    for system in sorted({r["system"] for r in report["runs"]}):
        rows = [r for r in report["runs"] if r["system"] == system and r["tok_per_s"]]
        linkless = all(r.get("link_point") is None for r in rows)  # stock's: no link of its own
        for link in [None] if linkless else links:
            pts = sorted((r["cache"], r["tok_per_s"]) for r in rows if r.get("link_point") == link)
            if not pts:
                continue
            if system in ("stock-resident", "llama-server"):  # every weight in memory: one run, a line
                ax.axhline(pts[0][1], linestyle=":", color="gray" if system == "stock-resident" else "black",
                           label=f"{system} (all in RAM)")
                continue
            label = system if linkless or len(links) < 2 else f"{system}, {link}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    first = links[0] if links else None
    bound = sorted((b["cache"], b["tok_per_s"]) for b in report["bound"]
                   if b["tok_per_s"] and b.get("link_point") in (first, None))
    if bound:
        ax.plot([b[0] for b in bound], [b[1] for b in bound], linestyle="--", color="black", label="bound")
    ax.set_xlabel("expert cache (% of routed expert bytes)")
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"decode throughput vs cache size (link: {first or report['protocol']['link']})")
    return _save(fig, ax, path)


def _save(fig: Any, ax: Any, path: Path) -> list[str]:
    """Grid, legend, write; the legend's labels."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return labels


def plot_links(report: dict[str, Any], path: Path) -> list[str]:
    """Decode throughput against the emulated link's rate: a line per system (per system and cache
    point where the sweep has several) and the bound of each cache point; the legend. Nothing
    written (an empty legend) unless the sweep has two or more emulated rates."""
    rated = [r for r in report["runs"] if _link_rate(r.get("link_point"))]
    if len({r["link_point"] for r in rated}) < 2:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    caches = sorted({r["cache"] for r in rated})
    for system in sorted({r["system"] for r in rated}):
        for cache in caches:
            pts = sorted((_link_rate(r["link_point"]) / 1e9, r["tok_per_s"]) for r in rated
                         if r["system"] == system and r["cache"] == cache and r["tok_per_s"])
            if pts:
                label = system if len(caches) < 2 else f"{system}, {cache:.0f}%"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    for cache in caches:
        bound = sorted((_link_rate(b["link_point"]) / 1e9, b["tok_per_s"]) for b in report["bound"]
                       if b["cache"] == cache and _link_rate(b.get("link_point")) and b["tok_per_s"])
        if bound:
            ax.plot([b[0] for b in bound], [b[1] for b in bound], linestyle="--", color="black",
                    label="bound" if len(caches) < 2 else f"bound, {cache:.0f}%")
    ax.set_xscale("log")
    rates = sorted({_link_rate(r["link_point"]) / 1e9 for r in rated})
    ax.set_xticks(rates, [f"{x:g}" for x in rates])
    ax.minorticks_off()
    ax.set_xlabel("emulated link rate (GB/s)")
    ax.set_ylabel("decode tok/s")
    where = f"expert cache {caches[0]:.0f}%" if len(caches) == 1 else "each cache point"
    ax.set_title(f"decode throughput vs emulated link rate ({where})")
    return _save(fig, ax, path)


def timeline(report: dict[str, Any]) -> dict[str, Any]:
    """Chrome trace: per system, a track per request (its decode steps), per context (the layer
    it waits on or computes) and per upload worker (the experts crossing the link)."""
    events: list[dict[str, Any]] = []
    names = {native.EVENT_WAIT: "wait", native.EVENT_COMPUTE: "compute"}
    for n, (system, data) in enumerate(sorted(report.get("timelines", {}).items())):
        base_pid = 10 * (n + 1)
        raw = data["events"]
        starts = [e[4] for e in raw] + [int(t * 1e9) for ts in data["request_times"] for t in ts[:1]]
        t0 = min(starts) if starts else 0
        pids = {"requests": base_pid, "contexts": base_pid + 1, "link": base_pid + 2}
        for label, pid in pids.items():
            events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"{system}: {label}"}})
        for i, times in enumerate(data["request_times"]):
            events.append({"name": "thread_name", "ph": "M", "pid": pids["requests"], "tid": i,
                           "args": {"name": f"request {i}"}})
            for step, (a, b) in enumerate(zip(times, times[1:])):
                events.append({"name": f"token {step + 1}", "ph": "X", "pid": pids["requests"], "tid": i,
                               "ts": (a * 1e9 - t0) / 1e3, "dur": (b - a) * 1e6})
        for kind, ctx, layer, expert, a, b in raw:
            if kind == native.EVENT_LOAD:
                events.append({"name": f"L{layer} E{expert}", "cat": "load", "ph": "X", "pid": pids["link"],
                               "tid": ctx, "ts": (a - t0) / 1e3, "dur": (b - a) / 1e3})
            else:
                events.append({"name": f"{names[kind]} L{layer}", "cat": names[kind], "ph": "X",
                               "pid": pids["contexts"], "tid": ctx, "ts": (a - t0) / 1e3, "dur": (b - a) / 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def plot_working_set(report: dict[str, Any], path: Path) -> bool:
    """The working-set curve (bench/working_set.py) against the cache points of the sweep: the
    share of the experts a span of decode tokens touches, beside the share each cache holds.
    False (nothing written) when the run recorded no curve."""
    curve = report["protocol"].get("working_set") or []
    if not curve:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([w["decode_tokens"] for w in curve], [100 * w["share"] for w in curve], marker="o",
            label="distinct experts a span touches")
    for pct in sorted({r["cache"] for r in report["runs"] if r.get("link_point") and r["cache"] < 100}):
        ax.axhline(pct, linestyle=":", color="gray")
        ax.annotate(f"cache {pct:.0f}%", (curve[0]["decode_tokens"], pct), fontsize=8, va="bottom")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("span (decode tokens)")
    ax.set_ylabel("% of every routed expert")
    ax.set_ylim(0, 100)
    ax.set_title("working set of the recorded order")
    return bool(_save(fig, ax, path))


def write_outputs(report: dict[str, Any], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.md", out / "report.json", out / "throughput.png", out / "timeline.json"]
    paths[0].write_text(markdown(report, command))
    paths[1].write_text(json.dumps(public_json(report), indent=1))
    plot(report, paths[2])
    paths[3].write_text(json.dumps(timeline(report)))
    if plot_links(report, out / "throughput_link.png"):
        paths.append(out / "throughput_link.png")
    if plot_working_set(report, out / "working_set.png"):
        paths.append(out / "working_set.png")
    return paths


def public_json(report: dict[str, Any]) -> dict[str, Any]:
    """The bench document (docs/cli.md; timelines go to timeline.json)."""
    return {"protocol": report["protocol"], "runs": report["runs"], "bound": report["bound"],
            "ratios": [r.as_json() for r in measured_ratios(report)]}


def _working_set_lines(p: dict[str, Any]) -> list[str]:
    """The working-set curve of the recorded order (bench/working_set.py), as one table."""
    curve = p.get("working_set") or []
    if not curve:
        return []
    where = "inside the steady-state window" if p["workload"] == "serve" else "over the decode steps"
    return ["", f"Working set of the recorded order ({where}, blocking's schedule): distinct experts a span of "
            "decode tokens touches (mean over consecutive spans; prompt chunks in a span count), and that as a "
            "share of every routed expert, the cache a span needs:", "",
            "| decode tokens | distinct experts | share | spans |", "|---|---|---|---|"] + [
        f"| {w['decode_tokens']} | {w['distinct_experts']:.0f} | {100 * w['share']:.1f}% | {w['spans']} |"
        for w in curve]


def _balance_lines(report: dict[str, Any], sweep: bool) -> list[str]:
    """Per point, blocking's link busy over its compute busy: where it is near 1 overlap can give
    up to 2x, so that is where runahead must win (bench/targets.py BALANCED)."""
    points = [(r["cache"], r.get("link_point"), balance(r)) for r in report["runs"] if r["system"] == "blocking"]
    points = [p for p in points if p[2] is not None]
    if not points:
        return []
    low, high = BALANCED
    return ["", f"Where runahead should win: blocking's link busy / compute busy per point ({low:g}-{high:g} is "
            "balanced, where overlapping them can give up to 2x and the balanced targets apply):", "",
            "| cache | " + ("link | " if sweep else "") + "link / compute | region |",
            "|---|" + ("---|" if sweep else "") + "---|---|"] + [
        f"| {cache:.0f}% | " + (f"{_link_cell(link)} | " if sweep else "") + f"{value:.2f} | "
        + ("balanced" if is_balanced(value) else "link-bound" if value > high else "compute-bound") + " |"
        for cache, link, value in points]


def _whole_mb(row: dict[str, Any]) -> str:
    """' (N)': the whole run's MB loaded beside the window's, where a serving row counted it."""
    return f" ({row['run_bytes_loaded'] / 1e6:.0f})" if row.get("run_bytes_loaded") is not None else ""


def _over(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _missed_lines(report: dict[str, Any], ratios: list[Any], sweep: bool) -> list[str]:
    """At each point where a target was missed, what bevy measured there beside blocking and the
    bound: the figures that say why (the link's busy share, bytes per decode token over
    blocking's and Belady's, compute used per token, the split calls' Python time, the threads
    a prompt call gets)."""
    missed: dict[tuple[float, str | None], list[str]] = {}
    for r in ratios:
        if r.met is False:
            missed.setdefault((r.cache, r.link), []).append(r.name)
    rows = {(r["system"], r["cache"], r.get("link_point")): r for r in report["runs"]}
    bounds = {(b["cache"], b.get("link_point")): b for b in report["bound"]}
    p = report["protocol"]
    lines = []
    for (cache, link), names in missed.items():
        bevy, blocking = rows.get(("bevy", cache, link)), rows.get(("blocking", cache, link))
        if not bevy:
            continue
        bound = bounds.get((cache, link)) or {}
        belady = per_token(bound | {"decode_tokens": p.get("decode_tokens")}, "belady_bytes")
        calls_s = (bevy.get("python_per_call_ms") or 0) * (bevy.get("layer_calls") or 0) / 1e3
        window = bevy.get("window_s") or bevy.get("decode_s")
        lanes = (bevy.get("lanes") or [1])[0] or 1
        lines.append(
            f"| {cache:.0f}% | " + (f"{_link_cell(link)} | " if sweep else "") + f"{len(names)} | "
            f"{_fmt(bevy.get('link_utilization'), '.2f')} / {_fmt((blocking or {}).get('link_utilization'), '.2f')} | "
            f"{_over(per_token(bevy, 'bytes_loaded'), per_token(blocking, 'bytes_loaded'))} / "
            f"{_over(per_token(bevy, 'bytes_loaded'), belady)} | "
            f"{_over(per_token(bevy, 'compute_used_s'), per_token(blocking, 'compute_used_s'))} | "
            f"{_fmt(window and 100 * calls_s / window, '.0f')}% | {max(1, p['threads'] // lanes)} of {p['threads']} |")
    if not lines:
        return []
    return ["", "What bevy measured where a target was missed (per point: how many missed; its link busy share "
            "of the window beside blocking's; its bytes per decode token over blocking's and over Belady's "
            "misses of the recorded order; its compute used per decode token over blocking's; the share of "
            "its window its step loop spent in Python between calls; the threads a call, a prompt chunk's "
            "included, computes on):", "",
            "| cache | " + ("link | " if sweep else "") + "missed | link util, bevy / blocking | bytes per token over "
            "blocking's / Belady's | compute used per token over blocking's | Python between calls | threads a call |",
            "|---|" + ("---|" if sweep else "") + "---|---|---|---|---|---|"] + lines
