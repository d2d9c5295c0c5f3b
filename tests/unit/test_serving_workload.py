"""The serve workload's stream and the steady-state window its figures are counted in."""

from __future__ import annotations

import pytest

from bevy_gguf.bench.window import (
    CounterSampler,
    Window,
    interpolate,
    steady_window,
    window_outputs,
    window_ttft_by_request,
)
from bevy_gguf.errors import BevyError
from bevy_gguf.workload.serving import ServeShape, serve_lengths, serving_requests


class ByteModel:
    """A tokenizer of one token per UTF-8 byte (as the generated models' byte vocabulary)."""

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode())

    def detokenize(self, tokens: list[int]) -> str:
        return bytes(tokens).decode(errors="replace")


def test_lengths_are_seeded_in_range_and_spread() -> None:
    shape = ServeShape(requests=200, prompt_tokens=(16, 512), decode_tokens=(32, 256), seed=3)
    lengths = serve_lengths(shape)
    assert lengths == serve_lengths(shape)
    assert lengths != serve_lengths(ServeShape(requests=200, seed=4))
    prompts, decodes = zip(*lengths)
    assert min(prompts) >= 16 and max(prompts) <= 512 and min(decodes) >= 32 and max(decodes) <= 256
    # log-uniform: about as many prompts below 90 (the range's geometric middle) as above it
    below = sum(p < 90 for p in prompts)
    assert 60 <= below <= 140
    assert max(prompts) > 400 and min(prompts) < 24


def test_requests_are_deterministic_teacher_forced_and_varied() -> None:
    shape = ServeShape(requests=12, prompt_tokens=(16, 300), decode_tokens=(32, 200), seed=0)
    a, b = serving_requests(ByteModel(), shape), serving_requests(ByteModel(), shape)
    assert [(r.prompt_tokens, r.forced) for r in a] == [(r.prompt_tokens, r.forced) for r in b]
    for r, (n_prompt, n_decode) in zip(a, serve_lengths(shape)):
        assert len(r.prompt_tokens) == n_prompt and len(r.forced) == n_decode and r.max_tokens == n_decode + 1
    assert len({bytes(r.prompt_tokens[:16]) for r in a}) == len(a)  # every request its own text


def test_a_length_no_text_reaches_is_one_clear_error() -> None:
    with pytest.raises(BevyError, match="lower the length ranges"):
        serving_requests(ByteModel(), ServeShape(requests=1, prompt_tokens=(10**6, 10**6)))
    with pytest.raises(BevyError, match="not a range"):
        ServeShape(prompt_tokens=(50, 10))


def test_the_window_runs_from_the_warmup_to_the_drain() -> None:
    # 10 requests, 4 in flight: all admitted once 6 have finished, so the 7th finish starts the drain
    finishes = [float(t) for t in (5, 1, 9, 2, 7, 3, 10, 4, 8, 6)]
    w = steady_window(finishes, n_parallel=4, warmup=4)
    assert (w.start, w.end) == (4.0, 7.0)
    with pytest.raises(BevyError, match="raise --requests"):
        steady_window(finishes, n_parallel=4, warmup=7)


def test_window_outputs_count_decode_outputs_inside_it() -> None:
    w = Window(2.0, 5.0)
    times = [[1.0, 2.0, 3.0, 4.5], [2.5, 5.0, 6.0], [0.5]]
    tokens, gaps = window_outputs(times, w)
    # the first output of a request is its prompt's; 2.0 is at the start (outside), 6.0 after the end
    assert tokens == 3
    assert sorted(gaps) == [1000.0, 1500.0, 2500.0]
    assert window_ttft_by_request([1.0, 2.4, None], [1.5, 2.5, 3.0], w) == {1: pytest.approx(100.0)}


def test_counters_are_interpolated_at_the_window_ends() -> None:
    times, samples = [0.0, 1.0, 2.0], [{"loads": 0}, {"loads": 10}, {"loads": 30}]
    assert interpolate(times, samples, 1.5) == {"loads": 20.0}
    assert interpolate(times, samples, -1.0) == {"loads": 0} and interpolate(times, samples, 9.0) == {"loads": 30}
    ticks = iter(range(1000))
    with CounterSampler(lambda: {"n": next(ticks)}, every_s=0.001) as sampler:
        pass
    assert len(sampler.samples) >= 2 and sampler.times == sorted(sampler.times)
    assert sampler.between(Window(sampler.times[0], sampler.times[-1]))["n"] == len(sampler.samples) - 1


def test_window_counters_keep_the_whole_runs_bytes_beside_the_windows() -> None:
    from bevy_gguf.bench.window import window_counters

    loaded = iter(range(0, 10_000, 100))
    with CounterSampler(lambda: {"bytes_loaded": next(loaded), "compute_busy_ns": 0}, every_s=0.001) as sampler:
        pass
    first, last = sampler.times[0], sampler.times[-1]
    whole = 100 * (len(sampler.samples) - 1)
    out = window_counters(sampler, Window(first, (first + last) / 2))
    assert out["run_bytes_loaded"] == whole and out["decode_counters"]["bytes_loaded"] < whole
    assert window_counters(CounterSampler(dict), Window(0.0, 1.0))["run_bytes_loaded"] is None
