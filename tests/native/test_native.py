"""libbevy on its own: links read exact bytes, policies replay like their definitions."""

from __future__ import annotations

import ctypes
import mmap
import random
import time
from collections import OrderedDict
from pathlib import Path

import pytest

from bevy_gguf._native import libbevy as native
from bevy_gguf.analysis.replay import belady_hits, replay_policy


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = random.Random(1).randbytes(3 * 4096 * 7 + 123)
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    return path, data


def read(link: int, offset: int, n: int) -> bytes:
    buf = ctypes.create_string_buffer(n)
    assert native.libbevy().bevy_link_read(link, offset, n, buf) == 0, native.last_error()
    return buf.raw


@pytest.mark.parametrize("kind", ["file", "ram", "throttle"])
def test_links_read_exact_unaligned_ranges(blob: tuple[Path, bytes], kind: str) -> None:
    lib = native.libbevy()
    path, data = blob
    if kind == "ram":
        sizes = (ctypes.c_uint64 * 1)(len(data))
        link = lib.bevy_link_ram_new(str(path).encode(), (ctypes.c_uint64 * 1)(0), sizes, 1)
    else:
        link = lib.bevy_link_file_new(str(path).encode())
        if kind == "throttle":
            link = lib.bevy_link_throttle_new(link, 20e6)
    assert link, native.last_error()
    rng = random.Random(2)
    for _ in range(20):
        offset = rng.randrange(len(data) - 1)
        n = rng.randint(1, min(50_000, len(data) - offset))
        assert read(link, offset, n) == data[offset:offset + n]
    buf = ctypes.create_string_buffer(10)
    assert lib.bevy_link_read(link, len(data) - 5, 10, buf) == -1 and native.last_error()
    lib.bevy_link_free(link)


def describe(link: int) -> str:
    buf = ctypes.create_string_buffer(128)
    native.libbevy().bevy_link_describe(link, buf, 128)
    return buf.value.decode()


def test_file_link_reads_page_aligned_ranges_without_a_copy(blob: tuple[Path, bytes]) -> None:
    """O_DIRECT reads go straight into dst when offset, size and dst are page aligned (no bounce
    copy), and through the bounce buffer otherwise; the bytes are exact either way."""
    lib = native.libbevy()
    path, data = blob
    link = lib.bevy_link_file_new(str(path).encode())
    if describe(link) != "file (O_DIRECT)":
        lib.bevy_link_free(link)
        pytest.skip(f"{describe(link)}: this file system has no O_DIRECT, so no bounce buffer to avoid")
    page = mmap.mmap(-1, 4 * 4096)  # page-aligned memory
    base = ctypes.addressof(ctypes.c_char.from_buffer(page))
    for offset, n, at, bounced in [(4096, 8192, 0, 0), (0, 4096, 4096, 0), (4096, 8192, 1, 1), (100, 4096, 0, 2),
                                   (8192, 4000, 0, 3)]:
        assert lib.bevy_link_read(link, offset, n, ctypes.c_void_p(base + at)) == 0, native.last_error()
        assert page[at:at + n] == data[offset:offset + n]
        assert lib.bevy_link_bounced(link) == bounced, (offset, n, at)
    lib.bevy_link_free(link)
    page.close()


def test_throttle_paces_and_says_emulated(blob: tuple[Path, bytes]) -> None:
    lib = native.libbevy()
    link = lib.bevy_link_throttle_new(lib.bevy_link_file_new(str(blob[0]).encode()), 1e6)  # 1 MB/s
    t = time.perf_counter()
    read(link, 0, 50_000)
    assert time.perf_counter() - t >= 0.045
    assert lib.bevy_link_emulated(link) == 1
    buf = ctypes.create_string_buffer(128)
    lib.bevy_link_describe(link, buf, 128)
    assert buf.value.decode().startswith("emulated 1 MB/s over file")
    lib.bevy_link_free(link)


def lru_reference(visits: list[tuple[int, list[int]]], n_slots: int) -> int:
    """LRU over one pool; a visit first uses its resident experts, then loads the others."""
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()
    hits = 0
    for il, experts in visits:
        keys = [(il, e) for e in experts]
        resident = [k for k in keys if k in cache]
        hits += len(resident)
        for key in resident:
            cache.move_to_end(key)
        for key in keys:
            if key in cache:
                continue
            if len(cache) >= n_slots:
                victim = next(k for k in cache if k not in keys)
                del cache[victim]
            cache[key] = None
    return hits


def random_visits(seed: int, n_layer: int = 4, n_expert: int = 16, k: int = 5, steps: int = 60) -> list:
    rng = random.Random(seed)
    hot = [rng.sample(range(n_expert), 6) for _ in range(n_layer)]
    visits = []
    for _ in range(steps):
        for il in range(n_layer):
            experts = set(rng.sample(hot[il], 3)) | set(rng.sample(range(n_expert), k - 3))
            visits.append((il, sorted(experts)))
    return visits


@pytest.mark.parametrize("seed", range(5))
def test_replayed_lru_matches_its_definition_and_belady_bounds_all(seed: int) -> None:
    visits = random_visits(seed)
    for n_slots in (5, 12, 30):
        lru = replay_policy("lru", visits, 4, 16, n_slots)
        assert lru == lru_reference(visits, n_slots)
        best = belady_hits(visits, n_slots)
        assert best >= lru and best >= replay_policy("next-use", visits, 4, 16, n_slots)
    assert replay_policy("next-use", visits, 4, 16, 64) == sum(len(e) for _, e in visits) - len(
        {(il, e) for il, es in visits for e in es})  # everything fits: only compulsory misses


def test_next_use_beats_lru_on_a_cycle() -> None:
    """Layers visited in a cycle that overflows the cache: LRU evicts exactly what comes next."""
    visits = [(il, list(range(4))) for _ in range(20) for il in range(4)]  # 16 experts, 12 slots
    assert replay_policy("lru", visits, 4, 4, 12) == 0
    assert replay_policy("next-use", visits, 4, 4, 12) > 0.5 * belady_hits(visits, 12)


def test_fault_link_fails_reads_by_count_and_says_so(blob: tuple[Path, bytes]) -> None:
    from bevy_gguf._native.bevy_handles import Link

    path, data = blob
    link = Link.file(path).fault(error_every=3, short_every=5)
    assert link.emulated() and link.describe().startswith("fault-injecting (errors every 3 reads, short reads every 5")
    lib = native.libbevy()
    outcomes = []
    for _ in range(6):
        buf = ctypes.create_string_buffer(100)
        ok = lib.bevy_link_read(link.handle, 10, 100, buf) == 0
        outcomes.append("ok" if ok else native.last_error())
        if ok:
            assert buf.raw == data[10:110]
    assert outcomes[0] == outcomes[1] == outcomes[3] == "ok"
    assert "I/O error (injected" in outcomes[2] and "I/O error (injected" in outcomes[5]
    assert outcomes[4].startswith("short read: 50 of 100 bytes")
    link.close()
