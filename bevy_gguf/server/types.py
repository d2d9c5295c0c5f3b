"""Request bodies of the HTTP API (OpenAI's shapes, the supported subset), its error body, and
server settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")  # other OpenAI fields are accepted and ignored

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)
    # llama-server's extensions: decode past end of generation; each streamed chunk says how many
    # tokens were generated so far (timings.predicted_n: a chunk can carry several, or none)
    ignore_eos: bool = False
    timings_per_token: bool = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and (len(v) > 4 or any(not s for s in v)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return v

    def sampling(self) -> dict[str, Any]:
        """SamplingParams fields; OpenAI's default temperature is 1."""
        return {"temperature": 1.0 if self.temperature is None else self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "min_p": self.min_p, "frequency_penalty": self.frequency_penalty,
                "presence_penalty": self.presence_penalty, "repeat_penalty": self.repeat_penalty,
                "seed": self.seed}


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and len(v) != 1:
            raise ValueError("give one prompt (a string, or a list of one string)")
        return v

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)

    def messages_as_dicts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    ctx_size: int = 2048          # tokens per sequence (prompt + completion)
    max_queued: int = 128         # waiting requests beyond --parallel; more get 503
    model_alias: str | None = None
    shutdown_grace_s: float = 30.0  # at SIGTERM/SIGINT, running requests get this long to finish
    head_timeout_s: float = 10.0    # a connection's first request head must be in by then, else it is closed
    max_body_bytes: int = 16 * 2**20  # a longer request body is answered 413
    max_json_depth: int = 32          # deeper JSON nesting is answered 400 (the API's bodies nest 3 deep)
