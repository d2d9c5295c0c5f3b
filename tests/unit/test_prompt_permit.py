"""The prompt permit: one lane at a time may prefill in chunks larger than its share."""

from __future__ import annotations

import threading

from bevy_gguf.engine.runners.layers import PromptPermit


def test_one_lane_holds_it_until_it_gives_it_back() -> None:
    permit = PromptPermit()
    assert permit.take(0) and permit.take(0)  # a second prompt of the same lane
    assert not permit.take(1)                 # the other lane goes in its own chunks
    permit.give(1)                            # not the holder's: nothing changes
    assert permit.owner == 0 and not permit.take(1)
    permit.give(0)
    assert permit.owner is None and permit.take(1) and permit.owner == 1
    assert permit.taken == 3


def test_lanes_racing_for_it_never_hold_it_together() -> None:
    permit = PromptPermit()
    holding = [0]
    overlaps = []
    lock = threading.Lock()

    def lane(i: int) -> None:
        for _ in range(2000):
            if permit.take(i):
                with lock:
                    holding[0] += 1
                    overlaps.append(holding[0])
                with lock:
                    holding[0] -= 1
                permit.give(i)

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps and max(overlaps) == 1 and permit.owner is None
