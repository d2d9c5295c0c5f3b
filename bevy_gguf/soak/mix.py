"""The soak's seeded request mix and what each answer must be (stock llama.cpp's greedy text).

Prompts are cut from the text workload (prose, code, numbers, several languages) at lengths
spread log-uniformly over 1..max_prompt_tokens; a job is one request: a completion or a chat,
streamed or not, with a stop string that occurs in its answer or none, cancelled mid-stream or
not. What is right for a prompt is its greedy text from stock llama.cpp decoding it alone, up to
the first near-tie (top-1 minus top-2 logit below MARGIN, docs/correctness.md): past it, a
batched decode may rightly take the other token.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from pathlib import Path

from bevy_gguf.config import EngineConfig
from bevy_gguf.engine.engine import LLMEngine
from bevy_gguf.engine.request import Request
from bevy_gguf.server.chat import render_chat
from bevy_gguf.server.stops import sendable
from bevy_gguf.workload import texts

MARGIN = 0.05          # the margin rule's near-tie (docs/correctness.md)
CANCEL_MAX_TOKENS = 64  # a cancelled request asks for this many: it is left mid-stream


@dataclass(frozen=True, slots=True)
class Prompt:
    kind: str            # "completion" or "chat"
    text: str            # the completion's prompt, or the chat's one user message
    rendered: str        # what the model reads (the chat template applied)
    stops: tuple[str, ...]  # stop strings the server adds (the chat template's)
    n_tokens: int
    pieces: tuple[bytes, ...]  # stock's greedy tokens up to the first near-tie, as bytes
    trusted_bytes: bytes  # ... joined, cut at the template's stop strings (stop strings match bytes)

    @property
    def trusted(self) -> str:
        """The trusted bytes as the server sends text: bytes that are not UTF-8 left out."""
        return text_of(self.trusted_bytes)


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    prompt: int          # index into the prompt list
    max_tokens: int
    stream: bool
    stop: str | None     # a stop string the request gives
    cancel_after: int    # streamed events read before leaving (0: read to the end)


def prompt_texts(n: int, max_tokens: int, seed: int) -> list[str]:
    """n prompt texts of about 1..max_tokens bytes, log-uniform, from the text workload."""
    r = random.Random(f"soak-prompts-{seed}")
    pool = [t.text for t in texts.texts(max(n, 8), seed)]
    out = []
    for i in range(n):
        length = max(1, round(math.exp(r.uniform(0, math.log(max_tokens)))))
        body = pool[i % len(pool)]
        while len(body.encode()) < length:
            body += " " + pool[r.randrange(len(pool))]
        out.append(body.encode()[:length].decode(errors="ignore") or "x")
    return out


def text_of(data: bytes) -> str:
    return data.decode("utf-8", errors="ignore")


def cut_at_stops(data: bytes, stops: tuple[str, ...]) -> bytes:
    """data up to its first stop string (matched on bytes, as the server sends it)."""
    return data[: sendable(data, stops, done=True)]


def trusted_count(margins: list[float]) -> int:
    """Tokens before the first whose margin is below MARGIN."""
    return next((i for i, m in enumerate(margins) if m < MARGIN), len(margins))


def reference_prompts(model: Path, n_completion: int, n_chat: int, max_prompt_tokens: int, max_tokens: int,
                      seed: int, threads: int) -> list[Prompt]:
    """The soak's prompts with stock llama.cpp's answers (--parallel 1, greedy)."""
    raw = prompt_texts(n_completion + n_chat, max_prompt_tokens, seed)
    n_ctx = max_prompt_tokens + max(max_tokens, CANCEL_MAX_TOKENS) + 64
    # flash attention off: CPU flash attention's sums depend on the thread count and the batch
    # (docs/correctness.md), so its greedy near-ties would not be the server's
    config = EngineConfig(model=model, engine="stock", n_parallel=1, n_threads=threads, n_ctx=n_ctx,
                          flash_attn="off")
    with LLMEngine(config) as engine:
        m = engine.model
        staged: list[tuple[str, str, str, tuple[str, ...], list[int]]] = []
        for i, text in enumerate(raw):
            kind = "completion" if i < n_completion else "chat"
            if kind == "chat":
                rendered, stops = render_chat(m, [{"role": "user", "content": text}])
            else:
                rendered, stops = text, []
            tokens = m.tokenize(rendered)
            while len(tokens) > max_prompt_tokens and len(text) > 1:  # a tokenizer with more than a token per byte
                text = text[: len(text) * max_prompt_tokens // len(tokens)]
                rendered = text if kind == "completion" else render_chat(m, [{"role": "user", "content": text}])[0]
                tokens = m.tokenize(rendered)
            staged.append((kind, text, rendered, tuple(stops), tokens))
        requests = [Request(prompt=s[2], prompt_tokens=s[4], max_tokens=max_tokens) for s in staged]
        engine.generate(requests)
        out = []
        for (kind, text, rendered, stops, tokens), req in zip(staged, requests):
            pieces = tuple(m.piece(t) for t in req.tokens[: trusted_count(req.margins)])
            out.append(Prompt(kind, text, rendered, stops, len(tokens), pieces,
                              cut_at_stops(b"".join(pieces), stops)))
    return out


def make_jobs(prompts: list[Prompt], n: int, max_tokens: int, seed: int, cancel_share: float = 0.1,
              stream_share: float = 1 / 3, stop_share: float = 0.2, cycle: int | None = None) -> list[Job]:
    """n seeded jobs over prompts: cancel_share of them streamed and left after 1-3 events, a
    further stream_share streamed to the end, stop_share given a stop string taken from the
    answer (so that it stops there). With cycle, the first `cycle` jobs repeat (renumbered), so
    any `cycle` consecutive jobs are the same mix: latency windows of that size compare like
    with like (one window's p50 against another's moved by +-20% with a fresh mix each)."""
    if cycle is not None and 0 < cycle < n:
        block = make_jobs(prompts, cycle, max_tokens, seed, cancel_share, stream_share, stop_share)
        return [replace(block[i % cycle], index=i) for i in range(n)]
    r = random.Random(f"soak-jobs-{seed}")
    jobs = []
    for i in range(n):
        p = r.randrange(len(prompts))
        roll = r.random()
        if roll < cancel_share:
            jobs.append(Job(i, p, CANCEL_MAX_TOKENS, True, None, r.randint(1, 3)))
            continue
        stream = roll < cancel_share + stream_share
        stop = None
        known = prompts[p].trusted_bytes
        if r.random() < stop_share and len(known) >= 3:
            at = r.randrange(1, len(known) - 1)
            piece = known[at: at + r.randint(1, 2)]
            stop = piece.decode() if piece.isascii() else None  # a stop string is text: its bytes UTF-8
        jobs.append(Job(i, p, r.randint(1, max_tokens), stream, stop, 0))
    return jobs


def check_answer(prompt: Prompt, job: Job, text: str, finish: str | None, n_tokens: int | None = None) -> str | None:
    """Why text (finish_reason finish, n_tokens generated where the response says) is not the
    right answer to job, or None if it is. Within stock's trusted tokens the answer is known
    exactly; past them it only has to agree with what is known. A cancelled job's text only has
    to agree."""
    trusted = prompt.trusted
    agrees = trusted.startswith(text) or text.startswith(trusted)
    if job.cancel_after:
        return None if agrees else f"its streamed part {text[:60]!r} disagrees with stock's {trusted[:60]!r}"
    if finish not in ("length", "stop"):
        return f"finish_reason {finish!r}"
    stops = ((job.stop,) if job.stop else ()) + prompt.stops
    if finish == "length" and n_tokens is not None and n_tokens <= len(prompt.pieces):  # known exactly
        data = b"".join(prompt.pieces[:n_tokens])
        if any(s.encode() in data for s in stops):
            return f"ran on past a stop string in stock's first {n_tokens} tokens {text_of(data)[:60]!r}"
        want = text_of(data)
        return None if text == want else f"{text[:60]!r} is not stock's first {n_tokens} tokens {want[:60]!r}"
    if job.stop and job.stop.encode() in prompt.trusted_bytes:  # it ends there, unless max_tokens comes first
        want = text_of(cut_at_stops(prompt.trusted_bytes, (job.stop,)))
        if finish == "stop" and text == want:
            return None
        completed = prompt.trusted_bytes.find(job.stop.encode()) + len(job.stop.encode())  # the stop's end
        short_of_it = len(text) < len(text_of(prompt.trusted_bytes[:completed]))
        if finish == "length" and trusted.startswith(text) and short_of_it:
            return None
        return f"{text[:60]!r} ({finish}) is not stock's {want[:60]!r}, cut at the stop string {job.stop!r}"
    if not agrees:
        return f"{text[:60]!r} disagrees with stock's {trusted[:60]!r}"
    if finish == "stop" and len(text) < len(trusted):  # only a stop string begun in the trusted bytes explains it
        data = prompt.trusted_bytes
        if not any(s.encode().startswith(data[k:]) and text_of(data[:k]) == text
                   for s in stops for k in range(max(len(data) - len(s.encode()) + 1, 0), len(data))):
            return f"stopped after {text[-20:]!r} where stock's text goes on: {trusted[len(text):][:40]!r}"
    return None
