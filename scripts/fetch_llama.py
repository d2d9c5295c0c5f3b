#!/usr/bin/env python3
"""Fetch the pinned llama.cpp source and lay out the stock and patched trees.

The llama-cpp-python sdist (pinned with its sha256 in LLAMA_CPP_PIN) carries llama.cpp in
vendor/llama.cpp. This script downloads it from PyPI into the cache, checks the hash, extracts
vendor/llama.cpp twice (build/src/stock, build/src/patched) and applies patches/series to the
patched tree, idempotently: an unchanged series is a no-op, a changed one is reverse-applied
and re-applied so only the touched files rebuild.

For a machine without a package registry (scripts/gpu_check.sh), --make-pruned writes a pruned
copy of the sdist (what a build and the Python binding need: no docs, models, tests, examples,
web UI or unused ggml backends; a BEVY_PRUNED file names the pinned sdist's sha256 it came from)
and --pruned lays out the trees from such a copy.

Standard library only: it runs before the package and its dependencies are installed.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import io
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN_FILE = ROOT / "LLAMA_CPP_PIN"
PATCH_DIR = ROOT / "patches"
APPLIED_DIR_NAME = ".bevy-applied-patches"
EXTRACT_STAMP = ".bevy-extracted"
INDEX_URL = os.environ.get("BEVY_GGUF_INDEX_URL", "https://pypi.org/simple")


class FetchError(Exception):
    """A failure with a message that names the problem and the fix."""


def read_pin() -> dict[str, str]:
    pin = {}
    for line in PIN_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    for key in ("package", "version", "filename", "sha256"):
        if key not in pin:
            raise FetchError(f"{PIN_FILE} lacks '{key}='; restore it from git")
    return pin


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bevy-gguf"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _LinkParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]


def sdist_url(pin: dict[str, str]) -> str:
    """Find the sdist's download address in the PyPI simple index."""
    url = f"{INDEX_URL}/{pin['package']}/"
    with urllib.request.urlopen(url, timeout=60) as resp:
        parser = _LinkParser()
        parser.feed(resp.read().decode())
    for link in parser.links:
        if link.split("#")[0].endswith("/" + pin["filename"]):
            return urllib.parse.urljoin(url, link.split("#")[0])
    raise FetchError(f"{pin['filename']} is not listed at {url}; check LLAMA_CPP_PIN")


def fetch_sdist(pin: dict[str, str]) -> Path:
    """Return the verified sdist in the cache, downloading it when missing or corrupt."""
    local = os.environ.get("BEVY_GGUF_SDIST")
    if local:
        path = Path(local)
        if sha256_of(path) != pin["sha256"]:
            raise FetchError(f"BEVY_GGUF_SDIST={path} does not match the pinned sha256; unset it")
        return path
    path = cache_dir() / "sdist" / pin["filename"]
    if path.exists() and sha256_of(path) == pin["sha256"]:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    url = sdist_url(pin)
    print(f"fetch: downloading {url}", file=sys.stderr)
    tmp = path.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as resp, open(tmp, "wb") as out:
        shutil.copyfileobj(resp, out)
    got = sha256_of(tmp)
    if got != pin["sha256"]:
        tmp.unlink()
        raise FetchError(f"sha256 mismatch for {pin['filename']}: got {got}, pinned {pin['sha256']}")
    tmp.replace(path)
    return path


def extract_tree(sdist: Path, pin: dict[str, str], dest: Path, pruned: bool = False) -> bool:
    """Extract vendor/llama.cpp into dest unless it already holds this sdist. True if extracted."""
    stamp = dest / EXTRACT_STAMP
    mark = ("pruned " if pruned else "") + pin["sha256"]
    if stamp.exists() and stamp.read_text().strip() == mark:
        return False
    if dest.exists():
        shutil.rmtree(dest)
    prefix = f"{pin['filename'].removesuffix('.tar.gz')}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name[len(prefix):]
            # skip the submodule's '.git' pointer: it would make git treat the tree as a checkout
            if m.name.startswith(prefix) and rel and rel.split("/")[0] != ".git":
                m.name = rel
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    (tmp / EXTRACT_STAMP).write_text(mark + "\n")
    tmp.rename(dest)
    return True


# what a pruned copy leaves out (paths under vendor/llama.cpp): nothing the stock or patched build,
# the patches or the Python binding use (the build turns tests, examples, the server and its UI off)
PRUNED_AWAY = ("docs", "models", "tests", "examples", "pocs", "benches", "media", "gguf-py", "conversion",
               "scripts", "requirements", "skills", "ci", ".github", ".devops", "app", "tools/ui", "tools/server")
KEPT_BACKENDS = ("ggml-cpu", "ggml-cuda")  # ggml/src/ggml-*/ folders kept; the others are not built
PRUNED_STAMP = "BEVY_PRUNED"


def pruned_away(rel: str) -> bool:
    """Is rel (a path under vendor/llama.cpp) left out of a pruned copy?"""
    if any(rel == p or rel.startswith(p + "/") for p in PRUNED_AWAY):
        return True
    parts = rel.split("/")
    return (len(parts) >= 3 and parts[:2] == ["ggml", "src"] and parts[2].startswith("ggml-")
            and "." not in parts[2] and parts[2] not in KEPT_BACKENDS)


def make_pruned(sdist: Path, pin: dict[str, str], out: Path) -> None:
    """Write a pruned copy of the sdist to out (a .tar.gz of the same layout)."""
    top = pin["filename"].removesuffix(".tar.gz")
    vendor = f"{top}/vendor/llama.cpp/"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tarfile.open(sdist) as src, tarfile.open(tmp, "w:gz") as dst:
        for m in src.getmembers():
            keep = m.name.startswith(f"{top}/llama_cpp/") or m.name in (f"{top}/llama_cpp", f"{top}/pyproject.toml")
            if m.name.startswith(vendor):
                rel = m.name[len(vendor):]
                keep = bool(rel) and rel.split("/")[0] != ".git" and not pruned_away(rel)
            if keep:
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        stamp = (pin["sha256"] + "\n").encode()
        info = tarfile.TarInfo(f"{top}/{PRUNED_STAMP}")
        info.size = len(stamp)
        dst.addfile(info, io.BytesIO(stamp))
    tmp.replace(out)


def check_pruned(path: Path, pin: dict[str, str]) -> None:
    """A pruned copy made from the pinned sdist (its BEVY_PRUNED names the pin's sha256), or FetchError."""
    name = f"{pin['filename'].removesuffix('.tar.gz')}/{PRUNED_STAMP}"
    try:
        with tarfile.open(path) as tar:
            stamp = tar.extractfile(name).read().decode().strip()
    except (OSError, KeyError, tarfile.TarError, AttributeError):
        raise FetchError(f"{path} is not a pruned copy of {pin['filename']} (no {PRUNED_STAMP}): "
                         "make it with scripts/fetch_llama.py --make-pruned") from None
    if stamp != pin["sha256"]:
        raise FetchError(f"{path} was pruned from another sdist than LLAMA_CPP_PIN's: make it again")


def read_series() -> list[Path]:
    series = PATCH_DIR / "series"
    if not series.exists():
        return []
    names = [ln.strip() for ln in series.read_text().splitlines()]
    patches = [PATCH_DIR / n for n in names if n and not n.startswith("#")]
    for p in patches:
        if not p.exists():
            raise FetchError(f"patches/series names {p.name}, which does not exist")
    return patches


def git_apply(tree: Path, patch: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    # The ceiling keeps git from treating our own repository as the patched tree's repository.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent))
    return subprocess.run(
        ["git", "apply", "--whitespace=nowarn", *flags, str(patch)],
        cwd=tree, env=env, text=True, capture_output=True,
    )


def apply_series(tree: Path) -> None:
    """Make the patched tree carry exactly patches/series, touching as few files as possible."""
    wanted = read_series()
    applied_dir = tree / APPLIED_DIR_NAME
    applied = sorted(applied_dir.glob("*.patch")) if applied_dir.exists() else []
    keep = 0  # the applied prefix that patches/series still starts with stays in place
    while (keep < min(len(applied), len(wanted)) and applied[keep].name == wanted[keep].name
           and applied[keep].read_bytes() == wanted[keep].read_bytes()):
        keep += 1
    if keep == len(applied) == len(wanted):
        return
    for old in reversed(applied[keep:]):
        if git_apply(tree, old, "--reverse").returncode != 0:
            raise FetchError(f"cannot un-apply {old.name} from {tree}; delete {tree} and rerun")
        old.unlink()
    applied_dir.mkdir(exist_ok=True)
    for patch in wanted[keep:]:
        if git_apply(tree, patch, "--check").returncode != 0:
            why = git_apply(tree, patch, "--check").stderr.strip().splitlines()[:3]
            raise FetchError(
                f"patch {patch.name} does not apply to llama.cpp from llama-cpp-python "
                f"{read_pin()['version']} ({'; '.join(why)}); regenerate it against the pinned "
                f"tree as patches/README.md describes"
            )
        git_apply(tree, patch).check_returncode()
        shutil.copy(patch, applied_dir / patch.name)
        print(f"fetch: applied {patch.name}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "build" / "src", help="where trees go")
    ap.add_argument("--sdist-only", action="store_true", help="fetch and print the sdist path")
    ap.add_argument("--make-pruned", type=Path, metavar="OUT.tar.gz", help="write a pruned copy of the sdist")
    ap.add_argument("--pruned", type=Path, metavar="PRUNED.tar.gz", help="lay out the trees from a pruned copy")
    args = ap.parse_args()
    try:
        pin = read_pin()
        if args.pruned:
            check_pruned(args.pruned, pin)
            sdist = args.pruned
        else:
            sdist = fetch_sdist(pin)
        if args.sdist_only:
            print(sdist)
            return 0
        if args.make_pruned:
            make_pruned(sdist, pin, args.make_pruned)
            print(args.make_pruned)
            return 0
        args.src.mkdir(parents=True, exist_ok=True)
        pruned = args.pruned is not None
        extract_tree(sdist, pin, args.src / "stock", pruned)
        patched = args.src / "patched"
        if extract_tree(sdist, pin, patched, pruned) is False and not (patched / "CMakeLists.txt").exists():
            raise FetchError(f"{patched} is incomplete; delete it and rerun")
        apply_series(patched)
    except (FetchError, OSError, subprocess.CalledProcessError) as e:
        print(f"fetch_llama: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
