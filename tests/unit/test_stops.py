"""What of a request's bytes the server may send: stop strings match bytes, as the engine's check."""

from bevy_gguf.server.stops import sendable


def test_done_cuts_at_the_first_stop_string() -> None:
    assert sendable(b"abc STOP def STOP", ("STOP",), done=True) == 4
    assert sendable(b"abc xy", ("y", "x"), done=True) == 4
    assert sendable(b"abc", ("zz",), done=True) == 3


def test_running_holds_back_a_tail_that_may_begin_a_stop_string() -> None:
    assert sendable(b"abc ST", ("STOP",), done=False) == 4
    assert sendable(b"abc S", ("STOP",), done=False) == 4
    assert sendable(b"abc", ("STOP",), done=False) == 3
    assert sendable(b"abc", (), done=False) == 3


def test_bytes_that_are_not_utf8_break_a_match() -> None:
    """The client's text leaves \\xc3 out, so it reads "$W"; the engine saw "$\\xc3W" and ran on:
    the text sent must not stop there either (it did when the server matched decoded text)."""
    assert sendable(b"x$\xc3Wb", ("$W",), done=True) == 5
    assert sendable(b"x$W\xc3b", ("$W",), done=True) == 1


def test_a_multibyte_stop_string_matches_its_utf8_bytes() -> None:
    data = "grüß dich".encode()
    assert sendable(data, ("ß",), done=True) == data.index("ß".encode())
    assert sendable(data[: data.index("ß".encode()) + 1], ("ß",), done=False) == data.index("ß".encode())
