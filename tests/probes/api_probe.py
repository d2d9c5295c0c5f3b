"""create_completion / generate_many on bevy_gguf.Llama or on llama-cpp-python's own Llama (stock
libllama), for the tests. usage: api_probe.py bevy|llama_cpp MODEL; prints JSON results."""

from __future__ import annotations

import json
import sys

CASES = [
    {"max_tokens": 12, "temperature": 0},
    {"max_tokens": 12, "temperature": 0.8, "seed": 42},
    {"max_tokens": 12, "temperature": 1.5, "top_k": 5, "seed": 7},
    {"max_tokens": 12, "temperature": 1.0, "top_p": 0.5, "min_p": 0.0, "seed": 3},
    {"max_tokens": 10, "temperature": 0.7, "repeat_penalty": 1.3, "seed": 11},
]
PROMPTS = ["Hello world", "def f(x):", "Grüß Gott"]


def main() -> int:
    which, model = sys.argv[1], sys.argv[2]
    if which == "bevy":
        import bevy_gguf

        llm = bevy_gguf.Llama(model, n_parallel=3, expert_cache="100%")
    else:
        from bevy_gguf._native.loader import use_libllama

        use_libllama("stock")
        import llama_cpp

        llm = llama_cpp.Llama(model, n_ctx=2048, n_threads=2, verbose=False)
    out = []
    for case in CASES:
        for p in PROMPTS:
            r = llm.create_completion(p, **case)
            out.append([r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]])
    # a stop string that the greedy text contains
    greedy = llm.create_completion(PROMPTS[1], max_tokens=24, temperature=0)["choices"][0]["text"]
    stop = greedy[len(greedy) // 2]
    r = llm.create_completion(PROMPTS[1], max_tokens=24, temperature=0, stop=[stop, "never-seen"])
    out.append([r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]])
    result = {"completions": out}
    if which == "bevy":
        many = llm.generate_many(PROMPTS, max_tokens=12, temperature=0)
        result["many"] = [m["choices"][0]["text"] for m in many]
        result["stats"] = llm.stats()
        llm.close()
    else:
        result["many"] = [llm.create_completion(p, max_tokens=12, temperature=0)["choices"][0]["text"]
                          for p in PROMPTS]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
