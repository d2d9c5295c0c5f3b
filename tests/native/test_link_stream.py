"""The calibration's link stream (calibrate._LinkStream): it moves experts only between start and
stop, counts what it moved, and leaves no read under way once stop returns."""

from __future__ import annotations

import time
from pathlib import Path

from bevy_gguf.config import LinkSpec
from bevy_gguf.engine.cache_layout import CacheLayout
from bevy_gguf.engine.calibrate import _LinkStream
from bevy_gguf.engine.expert_cache import ExpertCache
from bevy_gguf.gguf_info import inspect_model


def test_the_stream_moves_experts_only_between_start_and_stop(qwen3_tiny: Path) -> None:
    info = inspect_model(qwen3_tiny)
    slot = CacheLayout.of(info).slot_bytes
    # a throttled RAM link: 200 expert loads per second at most, on two threads
    link = LinkSpec.parse(f"throttle:{200 * slot / 1e6:.6f}MB/s:ram")
    with ExpertCache(info, 4 * slot, link, n_workers=2) as cache, _LinkStream(cache) as stream:
        time.sleep(0.05)
        assert stream._bytes == 0  # nothing before start
        stream.start()
        time.sleep(0.2)
        moved = stream.stop()
        assert stream.error is None and 10 <= moved <= 60, moved  # ~40 at the throttle's rate
        after = stream._bytes
        time.sleep(0.05)
        assert stream._bytes == after and stream._active == 0  # stopped: no read under way
        stream.start()
        assert stream.stop() < moved  # counted from the last start
