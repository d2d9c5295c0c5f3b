"""The soak's request mix and its answer check (bevy_gguf/soak/mix.py), on constructed prompts."""

from bevy_gguf.soak.mix import CANCEL_MAX_TOKENS, Job, Prompt, check_answer, make_jobs, prompt_texts


def prompt(pieces: list[bytes], stops: tuple[str, ...] = ()) -> Prompt:
    data = b"".join(pieces)
    for s in stops:
        data = data[: data.find(s.encode())] if s.encode() in data else data
    return Prompt("completion", "p", "p", stops, 3, tuple(pieces), data)


def job(max_tokens: int = 8, stop: str | None = None, cancel_after: int = 0) -> Job:
    return Job(0, 0, max_tokens, bool(cancel_after), stop, cancel_after)


P = prompt([b"He", b"llo", b" wo", b"rld"])


def test_the_trusted_answer_and_its_prefixes_pass() -> None:
    assert check_answer(P, job(), "Hello world", "length") is None
    assert check_answer(P, job(), "Hello world and more", "length") is None  # past the trusted tokens
    assert check_answer(P, job(2), "Hello", "length", n_tokens=2) is None


def test_a_wrong_or_short_answer_fails() -> None:
    assert check_answer(P, job(), "Hello there", "length") is not None
    assert check_answer(P, job(2), "He", "length", n_tokens=2) is not None  # two tokens are "Hello"
    assert check_answer(P, job(), "Hello world", "error") is not None
    assert check_answer(P, job(), "Hello", "stop") is not None  # stopped with nothing to stop at


def test_a_stop_string_in_the_answer_must_end_it_there() -> None:
    assert check_answer(P, job(stop="o w"), "Hell", "stop") is None
    assert check_answer(P, job(stop="o w"), "Hel", "length") is None  # max_tokens came first
    assert check_answer(P, job(stop="o w"), "Hello world", "length") is not None
    assert check_answer(P, job(stop="o w"), "Hell", "length") is None
    assert check_answer(P, job(stop="o w"), "Hello", "stop") is not None
    # a stop string that begins in the trusted text and goes on past it
    assert check_answer(P, job(stop="ld!"), "Hello wor", "stop") is None
    assert check_answer(P, job(stop="ld!"), "Hello wo", "stop") is not None


def test_a_stop_string_across_bytes_that_are_not_utf8_does_not_match() -> None:
    p = prompt([b"a$", b"\xc3", b"Wb"])  # the text reads "a$Wb", the bytes hold no "$W"
    assert check_answer(p, job(stop="$W"), "a$Wb", "length") is None
    assert check_answer(p, job(stop="$W"), "a", "stop") is not None


def test_max_tokens_before_a_stop_string_sends_what_was_generated() -> None:
    """Two tokens of "\xa3", "_", " ": the stop string "_ " is not complete, so "_" (the byte that
    is not UTF-8 left out) with finish "length" is right (the soak's first check said otherwise)."""
    p = prompt([b"\xa3", b"_", b" ", b"\x02"])
    assert check_answer(p, job(2, stop="_ "), "_", "length", n_tokens=2) is None
    assert check_answer(p, job(3, stop="_ "), "_ ", "length", n_tokens=3) is not None  # the stop was complete
    assert check_answer(p, job(3, stop="_ "), "", "stop") is None


def test_a_cancelled_answer_only_has_to_agree() -> None:
    assert check_answer(P, job(CANCEL_MAX_TOKENS, cancel_after=2), "Hel", None) is None
    assert check_answer(P, job(CANCEL_MAX_TOKENS, cancel_after=2), "Help", None) is not None


def test_jobs_are_seeded_and_mixed() -> None:
    prompts = [prompt([b"abc", b"def", b"ghi"]), prompt([b"x", b"yz"])]
    jobs = make_jobs(prompts, 2000, 24, seed=1)
    assert jobs == make_jobs(prompts, 2000, 24, seed=1) and jobs != make_jobs(prompts, 2000, 24, seed=2)
    cancelled = [j for j in jobs if j.cancel_after]
    assert 150 <= len(cancelled) <= 250 and all(j.stream and j.max_tokens == CANCEL_MAX_TOKENS for j in cancelled)
    streamed = [j for j in jobs if j.stream and not j.cancel_after]
    assert 500 <= len(streamed) <= 800
    with_stop = [j for j in jobs if j.stop]
    assert with_stop and all(j.stop.encode() in prompts[j.prompt].trusted_bytes for j in with_stop)


def test_prompt_lengths_spread_over_the_range() -> None:
    lengths = [len(t.encode()) for t in prompt_texts(200, 1000, seed=0)]
    assert min(lengths) <= 5 and max(lengths) >= 500 and all(1 <= n <= 1000 for n in lengths)


def test_latency_by_window_is_each_windows_p50_of_the_uncancelled() -> None:
    from bevy_gguf.soak.driver import Outcome, p50_by_window
    from bevy_gguf.soak.mix import Job

    jobs = [Job(i, 0, 4, False, None, cancel_after=int(i == 1)) for i in range(7)]
    measured = [Outcome(i, 0.001 * (i + 1)) for i in range(7)]  # 1..7 ms; job 1 cancelled
    assert p50_by_window(measured, jobs, 3) == [2.0, 5.0]  # [1, 3] and [4, 5, 6]; the last, short window left


def test_a_cycled_mix_puts_the_same_jobs_in_every_window() -> None:
    prompts = [prompt([b"abc", b"def", b"ghi"]), prompt([b"x", b"yz"])]
    jobs = make_jobs(prompts, 2500, 24, seed=1, cycle=1000)
    assert [j.index for j in jobs] == list(range(2500))
    assert jobs[:1000] == make_jobs(prompts, 1000, 24, seed=1)  # the first cycle is the plain mix

    def spec(j: object) -> tuple:
        return (j.prompt, j.max_tokens, j.stream, j.stop or "", j.cancel_after)

    first, last = sorted(map(spec, jobs[200:1200])), sorted(map(spec, jobs[-1000:]))
    assert first == last  # any 1,000 in a row: the same multiset, whatever the warm-up's length
