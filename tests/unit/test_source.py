"""The live queue a server fills: bounded, FIFO, and answerable when the runner stops."""

from __future__ import annotations

from bevy_gguf.engine.request import Request
from bevy_gguf.engine.source import LiveQueue


def request(i: int) -> Request:
    return Request(prompt=str(i), prompt_tokens=[1, 2], max_tokens=4)


def test_a_stopped_runner_leaves_no_request_unanswered() -> None:
    """What the runner took and had not finished, and what still waits, come back once (the
    engine fails them, so no client waits forever); the taken list keeps only unfinished ones."""
    q = LiveQueue(max_queued=8)
    reqs = [request(i) for i in range(6)]
    for r in reqs:
        assert q.put(r)
    taken = q.take(3)
    assert taken == reqs[:3]
    reqs[1].fail("done")
    assert q.take(1) == [reqs[3]]
    assert len(q._taken) == 3  # the finished one was dropped when the runner took again
    left = q.close_and_take_unfinished()
    assert left == [reqs[0], reqs[2], reqs[3], reqs[4], reqs[5]]
    assert not q.put(request(9)) and q.close_and_take_unfinished() == []


def test_close_and_take_refuses_new_requests_and_returns_the_queued() -> None:
    q = LiveQueue(max_queued=2)
    a, b, c = request(0), request(1), request(2)
    assert q.put(a) and q.put(b) and not q.put(c)  # full
    assert q.close_and_take() == [a, b]
    assert not q.put(c) and len(q) == 0 and not q.idle_wait()
