"""The `bevy-gguf` command line."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from bevy_gguf.bench.variants import OPTIONS as VARIANT_OPTIONS
from bevy_gguf.config import (
    DEFAULT_RUNAHEAD,
    ENGINES,
    EVERY_LAYER,
    EVICTIONS,
    FLASH_ATTN,
    LOAD_MODES,
    PREFILL_FIRST,
    RUNAHEAD,
    TWO_PASS,
    EngineConfig,
    physical_cores,
)
from bevy_gguf.engine.registry import DEFAULT_SCHEDULER, help_text, scheduler_names
from bevy_gguf.errors import BevyError
from bevy_gguf.synth.presets import PRESETS, preset_spec
from bevy_gguf.synth.spec import ARCHS, DTYPES, QUANTIZE_TYPES, ModelSpec
from bevy_gguf.workload.serving import DECODE_TOKENS, PROMPT_TOKENS, SERVE_REQUESTS_PER_SEQ

IN_PROCESS = "stock-resident,stock-offload,blocking,prefetch,bevy-ctx,bevy"
# bench's systems by workload: the serving stream adds stock llama-server and bevy-gguf serve,
# driven over HTTP (stock-resident stays: the bound's compute term is its window rate)
BENCH_SYSTEMS = {"serve": "llama-server,llama-server-offload,stock-resident,blocking,prefetch,bevy-ctx,bevy,"
                          "bevy-server", "text": IN_PROCESS, "generate": IN_PROCESS}

DEFAULT = ModelSpec()


class Parser(argparse.ArgumentParser):
    """Usage errors in one line, naming the fix (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive(name: str, kind: type = int, minimum: int = 1):  # noqa: ANN201 - an argparse type
    """An argparse type: an integer (or kind) of at least `minimum` (above 0 for a float)."""
    def parse(value: str) -> int | float:
        try:
            n = kind(value)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {value!r}") from None
        if (n < minimum if kind is int else not n > 0):
            bound = f"at least {minimum}" if kind is int else "above 0"
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, got {n}")
        return n
    return parse


def non_negative(name: str):  # noqa: ANN201 - an argparse type
    """An argparse type: an integer of at least 0."""
    return positive(name, minimum=0)


MODEL_FIELDS = ("arch", "experts", "top_k", "embd", "ff", "heads", "kv_heads", "head_size", "shared_ff",
                "dense_layers", "dense_ff", "vocab", "kv_lora", "linear_heads", "linear_key_heads",
                "linear_head_size", "seed", "dtype")


def _make_model_spec(args: argparse.Namespace) -> ModelSpec:
    """make-model's spec: the preset's (or the default model's), with the options given."""
    given = {f: getattr(args, f) for f in MODEL_FIELDS if getattr(args, f) is not None}
    given |= {"quantize": args.quantize or "", "tensor_types": tuple(args.tensor_type or ())}
    if args.preset:
        return preset_spec(args.preset, args.layers, **given)
    if args.layers is not None:
        given["layers"] = args.layers
    return replace(DEFAULT, **given)


def cmd_make_model(args: argparse.Namespace) -> int:
    from bevy_gguf.gguf_info import inspect_model
    from bevy_gguf.synth import make_model
    from bevy_gguf.synth.tensors import n_params

    spec = _make_model_spec(args)
    out = make_model(spec, Path(args.out), progress=sys.stderr.isatty())
    info = inspect_model(out)
    print(f"{out}: {spec.key}, {n_params(spec) / 1e9:.3f} B parameters, {info.file_bytes / 1e6:.1f} MB, "
          f"routed experts {info.expert_bytes / 1e6:.1f} MB")
    return 0


def _requests_maker(args: argparse.Namespace):  # noqa: ANN202
    from bevy_gguf.workload.prompts import fit_context, gather_prompts, generation_requests, workload_requests

    if args.workload:
        n = args.requests or 8
        make = lambda model: workload_requests(model, n, args.prompt_tokens, args.max_tokens - 1,  # noqa: E731
                                               forced=False)
    else:
        prompts = gather_prompts(args.prompt, Path(args.prompts) if args.prompts else None)
        if not prompts:
            raise BevyError("no prompts: give -p TEXT, --prompts FILE, --workload text, or pipe prompts on stdin")
        make = lambda model: generation_requests(model, prompts, args.max_tokens)  # noqa: E731
    if args.ctx_size is None:
        return make
    return lambda model: fit_context(make(model), args.ctx_size)


def engine_config(args: argparse.Namespace, **overrides: object) -> EngineConfig:
    """The EngineConfig of a command's engine options (add_engine_args)."""
    values = dict(model=Path(args.model), engine=getattr(args, "engine", "bevy"), scheduler=args.scheduler,
                  n_parallel=args.parallel, n_threads=args.threads, n_ctx=getattr(args, "ctx_size", None),
                  flash_attn=args.flash_attn, expert_cache=args.expert_cache, link=args.link,
                  eviction=args.eviction, link_workers=args.link_workers, wait_timeout_s=args.wait_timeout,
                  lanes=getattr(args, "lanes", 0), split_factor=getattr(args, "split_factor", 1.0),
                  load_budget=getattr(args, "load_budget", 1.0),
                  two_pass=getattr(args, "two_pass", "auto"),
                  runahead=getattr(args, "runahead", DEFAULT_RUNAHEAD), prefill_wave=getattr(args, "prefill_wave", 16),
                  prefill_first=getattr(args, "prefill_first", "auto"),
                  kv_unified=getattr(args, "kv_unified", False),
                  wide_prefill=getattr(args, "wide_prefill", False),
                  repack=not getattr(args, "no_repack", False), load_mode=getattr(args, "load_mode", "auto"),
                  device=getattr(args, "device", None),
                  gpu_layers=getattr(args, "gpu_layers", 0), n_cpu_moe=getattr(args, "n_cpu_moe", 0))
    return EngineConfig(**(values | overrides))


def cmd_run(args: argparse.Namespace) -> int:
    from bevy_gguf.cli.progress import LiveProgress
    from bevy_gguf.engine.run_result import run_requests

    make_requests = _requests_maker(args)
    live = not args.json and sys.stderr.isatty()
    config = engine_config(args)
    result = run_requests(config, make_requests, progress=LiveProgress if live else None)
    failed = [req for req in result.requests if req.error]
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return _failures(failed, len(result.requests))
    for i, (req, text) in enumerate(zip(result.requests, result.texts)):
        print(f"--- request {i} ({len(req.prompt_tokens)} prompt tokens, {len(req.tokens)} generated)")
        print(f"{req.prompt}\u2192{text}")
    print(f"{'request':>7} {'prompt':>6} {'tokens':>6} {'ttft ms':>8}  finish")
    for i, req in enumerate(result.requests):
        ttft = f"{req.ttft_s * 1e3:8.1f}" if req.ttft_s is not None else f"{'-':>8}"
        print(f"{i:>7} {len(req.prompt_tokens):>6} {len(req.tokens):>6} {ttft}  {req.error or req.finish_reason}")
    s = result.stats
    print(f"engine {config.engine}, parallel {config.n_parallel}: {s.decode_tokens} decode tokens in "
          f"{s.decode_s:.3f} s = {s.tok_per_s:.1f} tok/s; prefill {s.prefill_tokens} tokens in {s.prefill_s:.3f} s; "
          f"{config.n_threads} threads")
    if result.cache is not None:
        print_cache_summary(result.cache)
    return _failures(failed, len(result.requests))


def _failures(failed: list, n: int) -> int:
    """1, with a line naming the first failure, when requests failed (the others were answered)."""
    if not failed:
        return 0
    print(f"bevy-gguf: error: {len(failed)} of {n} requests failed; the first: {failed[0].error}", file=sys.stderr)
    return 1


def print_cache_summary(cache: dict) -> None:
    from bevy_gguf.engine.stats import hit_rate

    classes = cache["class_slots"]
    in_classes = f" in {len(classes)} slot classes ({', '.join(map(str, classes))})" if len(classes) > 1 else ""
    print(f"scheduler {cache['scheduler']}, expert cache {cache['bytes'] / 2**20:.1f} MiB = {cache['slots']} slots"
          f"{in_classes}, "
          f"micro-batch {cache['micro_batch']} tokens, link: {cache['link']}")
    print(f"{'layer':>5} {'hits':>7} {'misses':>7} {'hit%':>6} {'MB loaded':>10} {'stall s':>8}")
    for il, c in enumerate(cache["layers"]):
        print(f"{il:>5} {c['hits']:>7} {c['misses']:>7} {100 * hit_rate(c):>6.1f} {c['bytes_loaded'] / 1e6:>10.1f} "
              f"{c['stall_ns'] / 1e9:>8.3f}")
    for name, c in (("total", cache["total"]), ("decode", cache["decode"])):
        print(f"{name:>5} {c.get('hits', 0):>7} {c.get('misses', 0):>7} {100 * hit_rate(c):>6.1f} "
              f"{c.get('bytes_loaded', 0) / 1e6:>10.1f} {c.get('stall_ns', 0) / 1e9:>8.3f}"
              + (f"  link busy {c['link_busy_ns'] / 1e9:.3f} s" if "link_busy_ns" in c else ""))


def cmd_trace(args: argparse.Namespace) -> int:
    from bevy_gguf.analysis.trace import run_trace

    sizes = [x for x in (args.expert_cache or "").split(",") if x]
    return run_trace(Path(args.model), n_requests=args.requests, prompt_tokens=args.prompt_tokens,
                     steps=args.steps, n_threads=args.threads, as_json=args.json, cache_sizes=sizes)


def cmd_bench(args: argparse.Namespace) -> int:
    from bevy_gguf.bench.harness import BenchConfig, run_bench
    from bevy_gguf.bench.report import markdown, public_json, write_outputs

    sweeps = {"cache": [args.expert_cache], "link": [args.link]}
    for sweep in args.sweep or []:
        key, _, values = sweep.partition("=")
        if key not in sweeps or not values:
            raise BevyError(f"--sweep {sweep}: write it as cache=25%,50%,90% or link=throttle:1GB/s:ram,...")
        sweeps[key] = [v for v in values.split(",") if v]
    serve = args.workload == "serve"
    cfg = BenchConfig(model=Path(args.model), parallel=args.parallel,
                      requests=args.requests or (SERVE_REQUESTS_PER_SEQ * args.parallel if serve else args.parallel),
                      prompt_tokens=args.prompt_tokens or (PROMPT_TOKENS[1] if serve else 16),
                      steps=args.steps or (DECODE_TOKENS[1] if serve else 64), warmup=args.warmup,
                      threads=args.threads, link=args.link,
                      eviction=args.eviction, repeats=args.repeats,
                      systems=[s for s in (args.systems or BENCH_SYSTEMS[args.workload]).split(",") if s],
                      caches=sweeps["cache"],
                      links=sweeps["link"], workload=args.workload, timeline=bool(args.out),
                      split_factor=args.split_factor, lanes=args.lanes, two_pass=args.two_pass,
                      runahead=args.runahead, device=args.device, gpu_layers=args.gpu_layers)
    from bevy_gguf.gguf_info import inspect_model

    inspect_model(cfg.model)
    report = run_bench(cfg, progress=sys.stderr.isatty() and not args.json)
    command = "bevy-gguf " + shlex.join(args.argv)  # as given, run as `bevy-gguf` or `python -m bevy_gguf.cli`
    if args.out:
        for path in write_outputs(report, Path(args.out), command):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(public_json(report)))
    else:
        print(markdown(report, command))
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """The ggml devices of the patched build (what --device takes), as llama.cpp's --list-devices."""
    from bevy_gguf._native import llama_ext
    from bevy_gguf._native.loader import use_libllama

    kinds = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}
    devices = llama_ext.devices(use_libllama("patched"))
    if args.json:
        print(json.dumps([{"name": n, "type": kinds.get(t, str(t))} for n, t in devices]))
    else:
        for name, kind in devices:
            print(f"{name}\t{kinds.get(kind, kind)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from bevy_gguf.server.main import serve
    from bevy_gguf.server.types import ServerSettings

    config = engine_config(args)
    settings = ServerSettings(host=args.host, port=args.port, api_key=args.api_key, ctx_size=config.n_ctx,
                              max_queued=args.max_queued, model_alias=args.alias,
                              shutdown_grace_s=args.shutdown_grace, head_timeout_s=args.head_timeout)
    return serve(config, settings)


def cmd_soak(args: argparse.Namespace) -> int:
    from bevy_gguf.gguf_info import inspect_model
    from bevy_gguf.soak.run import minimum_cache, print_summary, run_soak

    model = Path(args.model)
    inspect_model(model)  # a bad file is one line, before any server starts
    cache = minimum_cache(model) if args.expert_cache == "min" else args.expert_cache
    serve_args = ["--parallel", str(args.parallel), "--threads", str(args.threads), "--scheduler", args.scheduler,
                  "--expert-cache", cache, "--link", args.link]
    out = Path(args.out or f"build/soak/{model.stem}-{args.scheduler}-{args.expert_cache.rstrip('%')}")
    summary = run_soak(model, args.requests, args.clients, serve_args, out, seed=args.seed, warmup=args.warmup,
                       max_prompt_tokens=args.max_prompt_tokens, max_tokens=args.max_tokens, threads=args.threads)
    print_summary(summary)
    print(f"soak: {'passed' if summary['passed'] else 'FAILED'}; report {out / 'soak.json'}, server log "
          f"{out / 'server.log'}")
    return 0 if summary["passed"] else 1


def add_model_arg(p: argparse.ArgumentParser) -> None:
    """The model, positional or as llama.cpp spells it (-m/--model)."""
    p.add_argument("model_pos", nargs="?", metavar="MODEL.gguf")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL.gguf", help="the model (or give it positionally)")
    p.set_defaults(subparser=p)


def resolve_model(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [m for m in (args.model_pos, args.model_opt) if m]
    if len(given) != 1:
        p.error("give the model once: bevy-gguf COMMAND MODEL.gguf (or -m MODEL.gguf)")
    args.model = given[0]


def add_engine_args(p: argparse.ArgumentParser, parallel_help: str, scheduler: bool = True) -> None:
    """The options of EngineConfig, with llama.cpp's spellings where llama.cpp has them."""
    p.add_argument("-np", "--parallel", type=positive("--parallel"), default=8, help=parallel_help)
    p.add_argument("-t", "--threads", type=positive("--threads"), default=physical_cores(),
                   help="threads (default: this machine's physical cores, %(default)s)")
    p.add_argument("-fa", "--flash-attn", choices=list(FLASH_ATTN), default="auto",
                   help="flash attention, as llama.cpp's -fa (default auto)")
    p.add_argument("-kvu", "--kv-unified", action="store_true",
                   help="as llama.cpp's: one KV buffer every sequence attends over under a mask (default: a stream "
                        "per sequence, as llama-server)")
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="as llama.cpp's: keep weights as the file has them (no interleaved CPU layouts)")
    p.add_argument("-lm", "--load-mode", choices=list(LOAD_MODES), default="auto",
                   help="as llama.cpp's: how the dense weights load (none: read into memory, not mapped, so a file "
                        "cut short while serving fails only expert loads); the routed experts come through the link")
    p.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=non_negative("--gpu-layers"),
                   default=0, metavar="N",
                   help="as llama.cpp's -ngl: layers whose dense weights and KV cache live on the GPU (default 0); "
                        "routed experts stay in the expert cache")
    p.add_argument("-ncmoe", "--n-cpu-moe", type=non_negative("--n-cpu-moe"), default=0, metavar="N",
                   help="stock engine, as llama.cpp's: the routed experts of the first N layers stay in host memory "
                        "(bevy's live in its cache)")
    p.add_argument("-cmoe", "--cpu-moe", dest="n_cpu_moe", action="store_const", const=EVERY_LAYER,
                   help="stock engine, as llama.cpp's: every layer's routed experts in host memory")
    p.add_argument("--device", default=None, metavar="NAME",
                   help="keep the expert cache in this ggml device's memory (e.g. CUDA0; CPU: ggml's CPU device); "
                        "default: host memory")
    if scheduler:
        p.add_argument("--scheduler", choices=scheduler_names(), default=DEFAULT_SCHEDULER, help=help_text())
    p.add_argument("--expert-cache", default="25%", metavar="SIZE",
                   help="cache size: a percentage of the routed expert bytes (25%%) or a size (512MiB)")
    p.add_argument("--link", default="file", help="file (O_DIRECT from the GGUF), ram, or throttle:RATE[:file|ram] "
                                                  "(an emulated link, reported as such)")
    p.add_argument("--eviction", choices=EVICTIONS, default="next-use")
    p.add_argument("--link-workers", type=positive("--link-workers"), default=4,
                   help="upload threads (several reads in flight keep a disk busier)")
    p.add_argument("--wait-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="a decode waiting longer for experts fails with an error")
    p.add_argument("--lanes", type=int, default=0,
                   help="bevy: split the sequences into this many contexts, each on its own share of the threads "
                        "(default 0: 1, 2, 4, ... up to one per thread, whichever this machine runs fastest, "
                        "measured at start)")
    p.add_argument("--two-pass", choices=TWO_PASS, default="auto",
                   help="compute each MoE layer's loaded experts while its missing ones load, then those "
                        "(the logits of one pass; default auto: bevy and bevy-ctx do, blocking and prefetch "
                        "stall as llama.cpp does)")
    p.add_argument("--runahead", choices=RUNAHEAD, default=DEFAULT_RUNAHEAD,
                   help="bevy: requests whose experts are in run ahead to later layers while the others' load "
                        "(on), groups stay whole, one call per step as blocking with two passes and the "
                        "router lookahead's loads (off, the default: measured faster in a serving stream), "
                        "or whichever decodes faster, measured in turn as it runs (auto)")
    p.add_argument("--prefill-wave", type=positive("--prefill-wave"), default=16, metavar="N",
                   help="bevy: prompt chunks that prefill together, layer-major: each layer's experts load once "
                        "for the N chunks instead of once per chunk (1: chunk after chunk)")
    p.add_argument("--wide-prefill", action="store_true",
                   help="bevy with lanes: a call with a prompt chunk runs on every thread when no other lane "
                        "computes (measured 0.86-1.05x the tok/s without it on 2 threads, so off by default)")
    p.add_argument("--prefill-first", choices=PREFILL_FIRST, nargs="?", const="on", default="auto",
                   help="bevy: a joining prompt's last wave runs before the next step's decode tokens (on, or "
                        "the flag alone: its first token sooner, as blocking and llama-server order them), "
                        "rides with them so they share its loads (off), or goes first while those tokens would "
                        "miss under one expert in their step, by the lane's measured miss rates (auto, the "
                        "default: nothing to share)")
    p.add_argument("--split-factor", type=float, default=1.0, metavar="X",
                   help="bevy: a group waits for a request whose experts land within X times the group's "
                        "compute, as the cost model measured on this machine predicts (0: run whatever is ready)")
    p.add_argument("--load-budget", type=float, default=1.0, metavar="X",
                   help="bevy: requests that run ahead of the most lagging ones may have at most X times the "
                        "experts of one batched layer loading or held (0: up to the cache; blocking loads one "
                        "batched layer's at a time)")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="bevy-gguf", description="Serve concurrent requests on MoE GGUF models "
                                 "whose experts do not fit in fast memory.")
    sub = ap.add_subparsers(dest="command", required=True)

    mm = sub.add_parser("make-model", help="generate a MoE GGUF with realistic routing (cached by parameters)")
    mm.add_argument("out", metavar="OUT.gguf")
    mm.add_argument("--preset", metavar="NAME",
                    help="a real model's published shape (the options below override it): " + ", ".join(PRESETS))
    mm.add_argument("--arch", choices=ARCHS, help=f"default {DEFAULT.arch}")
    for flag, what in (("--layers", "layers (with --preset: its first N)"), ("--experts", "routed experts per layer"),
                       ("--top-k", "experts per token"), ("--embd", "hidden size"), ("--ff", "expert width"),
                       ("--heads", "attention heads (0: embd / head size)"), ("--kv-heads", "KV heads (0: heads)"),
                       ("--head-size", "head dimension (0: 64, 32 below 256 wide)"),
                       ("--shared-ff", "shared expert width (qwen2moe, glm4moe, deepseek2: a multiple of ff; 0: ff)"),
                       ("--dense-layers", "leading dense FFN layers (glm4moe, deepseek2)"),
                       ("--dense-ff", "their width (0: 4 ff)"),
                       ("--vocab", "vocabulary size, padded with unused tokens (0: the tokenizer's)"),
                       ("--kv-lora", "deepseek2's compressed KV width, MLA's kv_lora_rank (0: 4 head size)"),
                       ("--linear-heads", "qwen35moe's linear-attention value heads (0: 2 linear key heads)"),
                       ("--linear-key-heads", "its key heads (0: heads)"),
                       ("--linear-head-size", "its key and value head size (0: head size)"),
                       ("--seed", "random seed")):
        field = flag[2:].replace("-", "_")
        mm.add_argument(flag, type=int, help=f"{what}; default {getattr(DEFAULT, field)}")
    mm.add_argument("--dtype", choices=DTYPES, help=f"default {DEFAULT.dtype}")
    mm.add_argument("--quantize", metavar="TYPE", type=str.upper,
                    help="pass the model through stock llama-quantize: " + ", ".join(QUANTIZE_TYPES))
    mm.add_argument("--tensor-type", metavar="NAME=TYPE", action="append",
                    help="llama-quantize's per-tensor type override (repeatable; needs --quantize), "
                         "e.g. ffn_down_exps=q6_k")
    mm.set_defaults(func=cmd_make_model)

    run = sub.add_parser("run", help="decode prompts concurrently and print the texts")
    add_model_arg(run)
    run.add_argument("-p", "--prompt", action="append", help="a prompt (repeatable)")
    run.add_argument("--prompts", metavar="FILE", help="a UTF-8 file, one prompt per line")
    run.add_argument("--workload", choices=["text"], help="take prompts from the text workload")
    run.add_argument("--requests", type=positive("--requests"), help="requests of --workload (default 8)")
    run.add_argument("--prompt-tokens", type=positive("--prompt-tokens"), default=16)
    run.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=positive("--n-predict"), default=48,
                     help="tokens to generate per request")
    run.add_argument("--engine", choices=ENGINES, default="bevy",
                     help="bevy: patched llama.cpp, experts served from a bounded cache; "
                          "stock: unpatched llama.cpp, one context, --parallel sequences per batch")
    run.add_argument("-c", "--ctx-size", type=positive("--ctx-size"),
                     help="tokens per request (prompt + output; default: what the requests need)")
    add_engine_args(run, "sequences decoded at once")
    run.add_argument("--json", action="store_true", help="print the run document (docs/cli.md)")
    run.set_defaults(func=cmd_run)

    be = sub.add_parser("bench", help="A/B benchmark against stock llama.cpp, side by side in one invocation")
    add_model_arg(be)
    be.add_argument("-np", "--parallel", type=positive("--parallel"), default=8)
    be.add_argument("--requests", type=positive("--requests"),
                    help=f"requests (default: --parallel; serve: {SERVE_REQUESTS_PER_SEQ} x --parallel)")
    be.add_argument("--expert-cache", default="25%", metavar="SIZE", help="the cache point without --sweep")
    be.add_argument("--sweep", metavar="KEY=A,B,...", action="append",
                    help="cache points (cache=25%%,50%%,90%%) or link points (link=throttle:0.5GB/s:ram,"
                         "throttle:2GB/s:ram); give both for every pair")
    be.add_argument("--systems",
                    help=f"comma-separated (default, serve: {BENCH_SYSTEMS['serve']}; text and generate: "
                         f"{BENCH_SYSTEMS['text']}); llama-server, llama-server-offload and bevy-server are servers "
                         "driven over HTTP by one client (serve only); a variant NAME:option=value[:...] (options "
                         f"{', '.join(VARIANT_OPTIONS)}) runs beside its base system for an in-run A/B, "
                         "e.g. bevy:two-pass=off")
    be.add_argument("--link", default="file")
    be.add_argument("--eviction", choices=EVICTIONS, default="next-use")
    be.add_argument("--repeats", type=positive("--repeats"), default=3)
    be.add_argument("--split-factor", type=float, default=1.0, metavar="X", help="bevy's (see run --help)")
    be.add_argument("--lanes", type=int, default=0, help="bevy's (see run --help)")
    be.add_argument("--two-pass", choices=TWO_PASS, default="auto", help="for every bevy-gguf system (see run --help)")
    be.add_argument("--runahead", choices=RUNAHEAD, default=DEFAULT_RUNAHEAD, help="bevy's (see run --help)")
    be.add_argument("--workload", choices=["text", "generate", "serve"], default="serve",
                    help="serve (default): a closed-loop stream of texts of varied lengths, measured in its steady "
                         "state; text: a burst of teacher-forced workload texts; generate: the same, greedy "
                         "generation (docs/benchmark.md)")
    be.add_argument("--prompt-tokens", type=positive("--prompt-tokens"),
                    help=f"prompt tokens (default 16; serve: the longest, default {PROMPT_TOKENS[1]})")
    be.add_argument("--steps", type=positive("--steps"),
                    help=f"decode steps (default 64; serve: the longest, default {DECODE_TOKENS[1]})")
    be.add_argument("--warmup", type=positive("--warmup"), default=0,
                    help="serve: requests finished before the measured window (default: --parallel)")
    be.add_argument("-t", "--threads", type=positive("--threads"), default=physical_cores(),
                    help="threads (default: this machine's physical cores, %(default)s)")
    be.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=non_negative("--gpu-layers"),
                    default=0, metavar="N",
                    help="every system's -ngl (see run --help)")
    be.add_argument("--device", default=None, metavar="NAME",
                    help="bevy-gguf's systems keep their expert cache on this ggml device (see run --help)")
    be.add_argument("--out", metavar="DIR",
                    help="write report.md, report.json, throughput.png (throughput_link.png with a link sweep), "
                         "working_set.png, timeline.json")
    be.add_argument("--json", action="store_true", help="print report.json")
    be.set_defaults(func=cmd_bench)

    dv = sub.add_parser("devices", help="list the ggml devices of this build (what --device takes)")
    dv.add_argument("--json", action="store_true")
    dv.set_defaults(func=cmd_devices)

    sv = sub.add_parser("serve", help="an OpenAI-compatible server (continuous batching over the bevy engine)")
    add_model_arg(sv)
    add_engine_args(sv, "requests decoded at once")
    sv.add_argument("--host", default="127.0.0.1", help="default: loopback only")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--api-key", help="require 'Authorization: Bearer KEY'")
    sv.add_argument("-c", "--ctx-size", type=positive("--ctx-size"), default=2048,
                    help="tokens per request (prompt + completion)")
    sv.add_argument("--max-queued", type=positive("--max-queued"), default=128,
                    help="requests waiting beyond --parallel; more are answered 503")
    sv.add_argument("--alias", help="the model id that /v1/models shows")
    sv.add_argument("--shutdown-grace", type=positive("--shutdown-grace", float), default=30.0, metavar="SECONDS",
                    help="at SIGTERM or SIGINT, running requests get this long to finish (queued ones get 503, "
                         "a second signal exits at once; default %(default)s)")
    sv.add_argument("--head-timeout", type=positive("--head-timeout", float), default=10.0, metavar="SECONDS",
                    help="a connection whose first request head is not in after SECONDS is closed "
                         "(idle and slow clients do not hold descriptors; default %(default)s)")
    sv.set_defaults(func=cmd_serve)

    so = sub.add_parser("soak", help="drive `serve` on loopback with a long seeded mix and check that it stays "
                                     "the same (answers, memory, descriptors, threads, latency)")
    add_model_arg(so)
    so.add_argument("--requests", type=positive("--requests"), default=20000)
    so.add_argument("--clients", type=positive("--clients"), default=32, help="concurrent clients")
    so.add_argument("--warmup", type=int, help="requests before the measured ones (default: 10%%, at most 1000)")
    so.add_argument("--seed", type=int, default=0)
    so.add_argument("--max-prompt-tokens", type=positive("--max-prompt-tokens"), default=1000)
    so.add_argument("--max-tokens", type=positive("--max-tokens"), default=24,
                    help="the largest max_tokens of a request that is not cancelled")
    so.add_argument("-np", "--parallel", type=positive("--parallel"), default=8)
    so.add_argument("-t", "--threads", type=positive("--threads"), default=physical_cores())
    so.add_argument("--scheduler", choices=scheduler_names(), default=DEFAULT_SCHEDULER)
    so.add_argument("--expert-cache", default="25%", metavar="SIZE",
                    help="as serve's, or min: the smallest the model allows")
    so.add_argument("--link", default="file")
    so.add_argument("--out", metavar="DIR", help="soak.json and server.log (default build/soak/NAME)")
    so.set_defaults(func=cmd_soak)

    tr = sub.add_parser("trace", help="record routing on the text workload and print its statistics")
    add_model_arg(tr)
    tr.add_argument("--workload", choices=["text"], default="text")
    tr.add_argument("--requests", type=positive("--requests"), default=8)
    tr.add_argument("--prompt-tokens", type=positive("--prompt-tokens"), default=16)
    tr.add_argument("--steps", type=positive("--steps"), default=64)
    tr.add_argument("-t", "--threads", type=positive("--threads"), default=physical_cores())
    tr.add_argument("--expert-cache", metavar="SIZES",
                    help="replay the routing against lru, next-use and Belady at these cache sizes (25%%,75%%)")
    tr.add_argument("--json", action="store_true")
    tr.set_defaults(func=cmd_trace)
    return ap


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)  # the command line, for reports
    if hasattr(args, "model_pos"):
        resolve_model(args.subparser, args)
    try:
        return args.func(args)
    except BevyError as e:
        print(f"bevy-gguf: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bevy-gguf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
