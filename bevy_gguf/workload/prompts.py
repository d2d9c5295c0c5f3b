"""Where prompts come from: -p, --prompts FILE, stdin, or the text workload."""

from __future__ import annotations

import sys
from pathlib import Path

from bevy_gguf._native.llama_handles import Model
from bevy_gguf.engine.request import Request
from bevy_gguf.errors import BevyError
from bevy_gguf.workload import texts as workload


def read_prompt_file(path: Path) -> list[str]:
    """One prompt per non-empty line of a UTF-8 file."""
    if not path.exists():
        raise BevyError(f"prompt file {path} does not exist: check the path")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BevyError(f"prompt file {path} is not UTF-8 (byte {e.start}): re-save it as UTF-8") from None
    return [line for line in text.splitlines() if line.strip()]


def read_stdin() -> list[str]:
    try:
        text = sys.stdin.buffer.read().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BevyError(f"stdin is not UTF-8 (byte {e.start}): pipe UTF-8 text") from None
    return [line for line in text.splitlines() if line.strip()]


def gather_prompts(prompts: list[str] | None, prompt_file: Path | None) -> list[str]:
    """Prompts from -p and --prompts, else from stdin when it is not a terminal."""
    out = list(prompts or [])
    if prompt_file is not None:
        out += read_prompt_file(prompt_file)
    if not out and not sys.stdin.isatty():
        out = read_stdin()
    for p in out:
        if not p:
            raise BevyError("an empty prompt was given: every prompt needs at least one character")
    return out


def generation_requests(model: Model, prompts: list[str], max_tokens: int) -> list[Request]:
    return [Request(prompt=p, prompt_tokens=model.tokenize(p), max_tokens=max_tokens) for p in prompts]


def workload_requests(model: Model, n: int, prompt_tokens: int, steps: int, seed: int = 0,
                      forced: bool = True) -> list[Request]:
    """n requests from different workload texts: a prompt of prompt_tokens tokens, then steps
    teacher-forced tokens of the same text (or, with forced=False, steps generated tokens)."""
    out = []
    for text in workload.texts(n, seed):
        tokens = model.tokenize(text.text)
        if len(tokens) < prompt_tokens + steps:
            raise BevyError(f"workload text {text.source} has only {len(tokens)} tokens: lower --steps")
        prompt = tokens[:prompt_tokens]
        out.append(Request(
            prompt=model.detokenize(prompt),
            prompt_tokens=prompt,
            max_tokens=steps + 1,
            forced=tokens[prompt_tokens:prompt_tokens + steps] if forced else None,
        ))
    return out


def fit_context(requests: list[Request], n_ctx: int) -> list[Request]:
    """Requests within n_ctx tokens each (-c): generation stops where the context ends, as in
    llama.cpp; a prompt that leaves no room is refused."""
    for i, r in enumerate(requests):
        room = n_ctx - len(r.prompt_tokens)
        if room < 1:
            raise BevyError(f"prompt {i} has {len(r.prompt_tokens)} tokens, --ctx-size is {n_ctx}: shorten it "
                            "or raise --ctx-size")
        r.max_tokens = min(r.max_tokens, room)
        if r.forced is not None:
            r.forced = r.forced[:room]
    return requests
