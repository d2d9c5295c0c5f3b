"""bench system variants: NAME:option=value, parsed to the worker's spec keys, bad ones refused in one line."""

from __future__ import annotations

import pytest

from bevy_gguf.bench.targets import measured_ratios
from bevy_gguf.bench.variants import parse_system
from bevy_gguf.bench.worker import BEVY_SYSTEMS, SYSTEMS
from bevy_gguf.errors import BevyError


def parse(name: str):  # noqa: ANN201
    return parse_system(name, SYSTEMS, BEVY_SYSTEMS)


def test_a_plain_system_has_no_options() -> None:
    v = parse("blocking")
    assert (v.base, v.options, v.is_variant) == ("blocking", {}, False)


def test_options_map_to_spec_keys_with_their_types() -> None:
    v = parse("bevy:two-pass=off:split-factor=1000:lanes=2:eviction=lru")
    assert v.base == "bevy" and v.name == "bevy:two-pass=off:split-factor=1000:lanes=2:eviction=lru"
    assert v.options == {"two_pass": "off", "split_factor": 1000.0, "lanes": 2, "eviction": "lru"}
    assert parse("bevy:runahead=off").options == {"runahead": "off"}
    assert parse("bevy:runahead=on:load-budget=0").options == {"runahead": "on", "load_budget": 0.0}
    assert parse("blocking:link-workers=8").options == {"link_workers": 8}
    assert parse("bevy:lane-clock=own").options == {"lane_clock": "own"}
    assert parse("bevy:resident-steps=all-in").options == {"resident_steps": "all-in"}


@pytest.mark.parametrize(("name", "says"), [
    ("bevy-fast", "unknown system 'bevy-fast'"),
    ("stock-resident:two-pass=off", "takes no options"),
    ("bevy:speed=2", "options two-pass, runahead, split-factor"),
    ("bevy:two-pass", "write options as"),
    ("bevy:two-pass=maybe", "choose one of"),
    ("bevy:runahead=sometimes", "runahead=sometimes: choose one of auto, on, off"),
    ("bevy:lanes=two", "is not a number"),
    ("bevy:split-factor=-1", "at least 0"),
    ("bevy:load-budget=-1", "load-budget must be at least 0"),
    ("blocking:link-workers=0", "link-workers must be at least 1"),
    ("bevy:lane-clock=shared", "lane-clock=shared: choose one of relative, own"),
    ("bevy:resident-steps=some", "resident-steps=some: choose one of rare-misses, all-in"),
])
def test_bad_variants_are_refused_in_one_line(name: str, says: str) -> None:
    with pytest.raises(BevyError, match=says) as e:
        parse(name)
    assert "\n" not in str(e.value)


def test_a_variant_is_compared_with_its_base_at_each_point_without_a_target() -> None:
    runs = [{"system": s, "cache": c, "link_point": "file", "tok_per_s": t, "repeats": r}
            for s, c, t, r in [("bevy", 50.0, 100.0, [90.0, 110.0]), ("bevy:two-pass=off", 50.0, 80.0, [72.0, 99.0]),
                               ("bevy:lanes=2", 100.0, 50.0, [50.0, 50.0])]]
    ratios = measured_ratios({"protocol": {"repeats": 2}, "runs": runs, "bound": []})
    ab = [r for r in ratios if ":" in r.name]
    assert [(r.name, r.cache) for r in ab] == [("bevy:two-pass=off / bevy", 50.0)]  # no base at 100%
    assert ab[0].value == pytest.approx(0.8) and ab[0].target is None and ab[0].met is None
    assert (ab[0].low, ab[0].high) == pytest.approx((0.8, 0.9))
