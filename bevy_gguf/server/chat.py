"""Chat messages to a prompt: the GGUF's chat template, or a documented default.

Generated models carry no template; the default is

    <|system|>\\n{content}\\n ... <|user|>\\n{content}\\n ... <|assistant|>\\n

(one block per message, then the assistant's header), and generation stops at the next
`<|user|>` or `<|system|>`.
"""

from __future__ import annotations

from bevy_gguf._native.llama_handles import Model

DEFAULT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
DEFAULT_STOPS = ["<|user|>", "<|system|>"]


def render_chat(model: Model, messages: list[dict[str, str]]) -> tuple[str, list[str]]:
    """(prompt, extra stop strings) for messages, with llama-cpp-python's Jinja2 formatter."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.metadata("tokenizer.chat_template")
    formatter = Jinja2ChatFormatter(template=template or DEFAULT_TEMPLATE, eos_token=model.special_text("eos"),
                                    bos_token=model.special_text("bos"), add_generation_prompt=True)
    result = formatter(messages=messages)
    stops = [] if template else list(DEFAULT_STOPS)
    if result.stop:
        stops += [result.stop] if isinstance(result.stop, str) else list(result.stop)
    return result.prompt, stops
