"""Shape presets: the published configurations of the MoE models people run (`make-model --preset`).

Each preset is the model's config.json in our spec's terms (hidden size, experts, top-k, expert
width, heads, KV heads, head dimension, shared expert, dense leading layers, vocabulary, and
for deepseek2 MLA's compressed KV width), with
the total parameter count its authors publish, so a test can hold the shape to it. `--layers N`
shortens a preset to its first N layers (the dense leading ones kept).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bevy_gguf.errors import BevyError
from bevy_gguf.synth.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class Preset:
    spec: ModelSpec
    published_params: float  # total parameters, as the model card gives them
    source: str              # where the shape comes from


PRESETS: dict[str, Preset] = {
    "qwen3-30b-a3b": Preset(
        ModelSpec(arch="qwen3moe", layers=48, experts=128, top_k=8, embd=2048, ff=768,
                  heads=32, kv_heads=4, head_size=128, vocab=151936),
        30.5e9, "Qwen/Qwen3-30B-A3B config.json"),
    "qwen3-235b-a22b": Preset(
        ModelSpec(arch="qwen3moe", layers=94, experts=128, top_k=8, embd=4096, ff=1536,
                  heads=64, kv_heads=4, head_size=128, vocab=151936),
        235e9, "Qwen/Qwen3-235B-A22B config.json"),
    "qwen1.5-moe-a2.7b": Preset(
        ModelSpec(arch="qwen2moe", layers=24, experts=60, top_k=4, embd=2048, ff=1408, shared_ff=5632,
                  heads=16, kv_heads=16, head_size=128, vocab=151936),
        14.3e9, "Qwen/Qwen1.5-MoE-A2.7B config.json"),
    "mixtral-8x7b": Preset(
        ModelSpec(arch="mixtral", layers=32, experts=8, top_k=2, embd=4096, ff=14336,
                  heads=32, kv_heads=8, head_size=128, vocab=32000),
        46.7e9, "mistralai/Mixtral-8x7B-v0.1 config.json"),
    "gpt-oss-20b": Preset(
        ModelSpec(arch="gpt-oss", layers=24, experts=32, top_k=4, embd=2880, ff=2880,
                  heads=64, kv_heads=8, head_size=64, vocab=201088),
        20.9e9, "openai/gpt-oss-20b config.json"),
    "gpt-oss-120b": Preset(
        ModelSpec(arch="gpt-oss", layers=36, experts=128, top_k=4, embd=2880, ff=2880,
                  heads=64, kv_heads=8, head_size=64, vocab=201088),
        116.8e9, "openai/gpt-oss-120b config.json"),
    "glm-4.5-air": Preset(
        ModelSpec(arch="glm4moe", layers=46, experts=128, top_k=8, embd=4096, ff=1408, shared_ff=1408,
                  dense_layers=1, dense_ff=10944, heads=96, kv_heads=8, head_size=128, vocab=151552),
        106e9, "zai-org/GLM-4.5-Air config.json (without its MTP layer)"),
    "qwen3.5-35b-a3b": Preset(
        ModelSpec(arch="qwen35moe", layers=40, experts=256, top_k=8, embd=2048, ff=512, shared_ff=512,
                  heads=16, kv_heads=2, head_size=256, linear_heads=32, linear_key_heads=16, linear_head_size=128,
                  vocab=248320),
        35e9, "Qwen/Qwen3.5-35B-A3B config.json (its text model; 35 B in the model card)"),
    "deepseek-v2-lite": Preset(
        ModelSpec(arch="deepseek2", layers=27, experts=64, top_k=6, embd=2048, ff=1408, shared_ff=2816,
                  dense_layers=1, dense_ff=10944, heads=16, head_size=128, kv_lora=512, vocab=102400),
        15.7e9, "deepseek-ai/DeepSeek-V2-Lite config.json"),
}


def preset_spec(name: str, layers: int | None = None, **overrides: object) -> ModelSpec:
    """The spec of preset `name`, shortened to `layers` and with any other field overridden."""
    if name not in PRESETS:
        raise BevyError(f"unknown --preset {name!r}: choose one of {', '.join(PRESETS)}")
    spec = PRESETS[name].spec
    if layers is not None:
        if layers <= spec.dense_layers:
            raise BevyError(f"--layers {layers}: {name} needs more than its {spec.dense_layers} dense leading layer(s)")
        overrides["layers"] = layers
    return replace(spec, **overrides)
