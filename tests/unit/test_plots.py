"""bench's plots on a constructed report: a cache sweep combined with a link sweep draws a line per
system and link point against the cache, and a line per system and cache point against the link."""

from __future__ import annotations

from pathlib import Path

from bevy_gguf.bench.report import plot, plot_links, plot_working_set

LINKS = ("throttle:1GB/s:ram", "throttle:2GB/s:ram")


def _report(links: tuple[str, ...]) -> dict:
    runs = [{"system": "stock-resident", "cache": 100.0, "link_point": None, "tok_per_s": 300.0},
            {"system": "llama-server", "cache": 100.0, "link_point": None, "tok_per_s": 320.0}]
    bound = []
    for cache in (25.0, 50.0):
        runs.append({"system": "stock-offload", "cache": cache, "link_point": None, "tok_per_s": 20.0})
        for k, link in enumerate(links):
            for system, rate in (("blocking", 50.0), ("bevy", 60.0)):
                runs.append({"system": system, "cache": cache, "link_point": link, "tok_per_s": rate * (k + 1)})
            bound.append({"cache": cache, "link_point": link, "tok_per_s": 100.0 * (k + 1)})
    working_set = [{"decode_tokens": 8, "share": 0.4}, {"decode_tokens": 16, "share": 0.6}]
    return {"runs": runs, "bound": bound, "protocol": {"link": links[0], "working_set": working_set}}


def test_a_cache_and_link_sweep_draws_both_figures(tmp_path: Path) -> None:
    report = _report(LINKS)
    labels = plot(report, tmp_path / "t.png")
    assert sorted(labels) == sorted(["bevy, throttle:1GB/s:ram", "bevy, throttle:2GB/s:ram",
                                     "blocking, throttle:1GB/s:ram", "blocking, throttle:2GB/s:ram",
                                     "stock-offload", "stock-resident (all in RAM)", "llama-server (all in RAM)",
                                     "bound"])
    labels = plot_links(report, tmp_path / "l.png")
    assert sorted(labels) == sorted(["bevy, 25%", "bevy, 50%", "blocking, 25%", "blocking, 50%",
                                     "bound, 25%", "bound, 50%"])
    assert (tmp_path / "l.png").read_bytes()[:4] == b"\x89PNG"
    assert plot_working_set(report, tmp_path / "w.png") and (tmp_path / "w.png").stat().st_size > 0


def test_one_link_point_draws_no_link_figure(tmp_path: Path) -> None:
    report = _report(LINKS[:1])
    assert "bevy" in plot(report, tmp_path / "t.png")  # one link: plain system names
    assert plot_links(report, tmp_path / "l.png") == [] and not (tmp_path / "l.png").exists()
