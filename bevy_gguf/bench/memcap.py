"""A memory cgroup for `stock-offload`: real stock llama.cpp under the same memory budget.

cgroup v1 (memory controller mounted at /sys/fs/cgroup/memory) or v2 (a delegated subtree with
the memory controller). The model file's pages are evicted from the page cache first
(posix_fadvise DONTNEED, no privilege needed): pages cached earlier are charged to another
cgroup and would make the cap meaningless. If no cgroup can be made, `available()` says why and
the row is reported as unavailable, never with a stand-in number.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def evict_page_cache(path: Path) -> None:
    """Drop a file's pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class MemoryCap:
    """A fresh memory cgroup capped at `limit` bytes; processes join it by pid."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.path: Path | None = None
        self.version = 0
        self.reason = ""
        name = f"bevy-gguf-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if (V1_ROOT / "memory.limit_in_bytes").exists():
            self._make_v1(V1_ROOT / name)
        if self.path is None:
            for root in V2_ROOTS:
                if (root / "cgroup.controllers").exists() and "memory" in (root / "cgroup.subtree_control").read_text():
                    self._make_v2(root / name)
                    if self.path:
                        break
        if self.path is None and not self.reason:
            self.reason = "no writable memory cgroup (v1 memory controller or delegated v2 subtree) on this machine"

    def _make_v1(self, path: Path) -> None:
        try:
            path.mkdir()
            (path / "memory.limit_in_bytes").write_text(str(self.limit))
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # no escape into swap
                swap.write_text(str(self.limit))
            self.path, self.version = path, 1
        except OSError as e:
            self.reason = f"cgroup v1 memory controller refused: {e}"
            self._remove(path)

    def _make_v2(self, path: Path) -> None:
        try:
            path.mkdir()
            (path / "memory.max").write_text(str(self.limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            self.path, self.version = path, 2
        except OSError as e:
            self.reason = f"cgroup v2 refused: {e}"
            self._remove(path)

    @property
    def available(self) -> bool:
        return self.path is not None

    def join(self, pid: int) -> None:
        """Move pid into the cgroup (call in the child before it allocates)."""
        assert self.path is not None
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_killed(self) -> bool:
        if self.path is None:
            return False
        if self.version == 1:
            return int((self.path / "memory.failcnt").read_text() or 0) > 0 and "oom_kill 1" in (
                self.path / "memory.oom_control").read_text()
        events = (self.path / "memory.events").read_text()
        return any(line.startswith("oom_kill ") and line.split()[1] != "0" for line in events.splitlines())

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.rmdir()
        except OSError:
            pass

    def close(self) -> None:
        if self.path is not None:
            self._remove(self.path)
            self.path = None
