"""What O_DIRECT costs on experts that do not start a page: the link alone, three ways, interleaved.

usage: python -m bevy_gguf.bench.link_reads MODEL.gguf [--rounds 5] [--threads 4]

Every routed expert of the file (each kind apart, as the upload workers load them) is read by
`threads` readers through the file link, three ways per round, the rounds interleaved:
- `page-aligned`: reads of the same sizes at the page-aligned offsets just below the experts'
  (what a file whose experts start pages would cost: the baseline);
- `bounce`: the experts into packed buffers (the link reads each one's aligned superset into a
  bounce buffer and copies it out: what packed slots cost);
- `room`: the experts into buffers with a page of room on each side (the superset straight in:
  what strided slots and staging buffers cost, cache_layout.SlotClass.kind_stride).
Prints GB/s (median and range over rounds), CPU microseconds per read and bounce copies per round.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

from bevy_gguf._native.bevy_handles import Link
from bevy_gguf.engine.cache_layout import PAGE
from bevy_gguf.engine.calibrate import _aligned
from bevy_gguf.errors import BevyError
from bevy_gguf.gguf_info import inspect_model

WAYS = ("page-aligned", "bounce", "room")


def expert_reads(model: Path) -> list[tuple[int, int]]:
    """(offset, bytes) of every routed expert of every kind."""
    reads = []
    for t in inspect_model(model).expert_tensors:
        per = t.nbytes // t.n_expert
        reads += [(t.offset + e * per, per) for e in range(t.n_expert)]
    return reads


def one_round(model: Path, way: str, reads: list[tuple[int, int]], threads: int) -> tuple[float, float, int]:
    """(GB/s, CPU us per read, bounce copies) of one way over every read."""
    link = Link.file(model)

    def reader(part: list[tuple[int, int]]) -> None:
        buf = _aligned(max(n for _, n in part) + 2 * PAGE)
        for offset, n in part:
            if way == "page-aligned":
                link.read(offset - offset % PAGE, buf[:n], after=2 * PAGE)
            elif way == "bounce":
                link.read(offset, buf[:n])
            else:
                at = offset % PAGE
                link.read(offset, buf[at: at + n], before=at, after=2 * PAGE - at)

    parts = [p for p in (reads[i::threads] for i in range(threads)) if p]
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    workers = [threading.Thread(target=reader, args=(p,)) for p in parts]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return sum(n for _, n in reads) / seconds / 1e9, 1e6 * cpu / len(reads), link.bounced()


def measure(model: Path, reads: list[tuple[int, int]], rounds: int,
            threads: int) -> dict[str, list[tuple[float, float, int]]]:
    out: dict[str, list[tuple[float, float, int]]] = {w: [] for w in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            out[way].append(one_round(model, way, reads, threads))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bevy_gguf.bench.link_reads", description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4, help="readers (the cache's default link workers: 4)")
    args = ap.parse_args(argv)
    try:
        reads = expert_reads(args.model)
        if not reads:
            raise BevyError(f"{args.model} has no routed experts")
        results = measure(args.model, reads, max(1, args.rounds), max(1, args.threads))
    except BevyError as e:
        print(f"bevy-gguf: {e}", file=sys.stderr)
        return 1
    unaligned = sum(o % PAGE != 0 for o, _ in reads)
    print(f"{args.model.name}: {len(reads)} expert reads ({unaligned} not starting a page), "
          f"{args.threads} readers, {args.rounds} interleaved rounds; link: {Link.file(args.model).describe()}")
    for way, rows in results.items():
        rates = [r[0] for r in rows]
        print(f"{way:>13}: {statistics.median(rates):.2f} GB/s ({min(rates):.2f}-{max(rates):.2f}), "
              f"{statistics.median(r[1] for r in rows):.0f} us CPU per read, {rows[0][2]} bounce copies per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
