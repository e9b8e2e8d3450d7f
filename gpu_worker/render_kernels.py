"""Compiled kernels of the problem's own template, shared between the candidate children that load it.

A candidate child compiles into a Triton cache of its own (sandbox.triton_env): a cache two children shared
would let one candidate's process leave files for its next one, a channel past the fresh-process re-measure.
A source that is a render of the problem's template (its `KNOBS` line set to values of its knob space, every
other byte the repository's) runs no code but the repository's, so what its child compiled is what Triton
makes of that source and nothing else. The worker keeps those entries (`RenderKernels.harvest`, after the
child's compile) and copies them into each later child of the same source (`seed`, before its load), on this
host and across the worker's restarts: the search policy's candidates and an LLM run's starting kernel, best
and re-measured, are compiled once per shape instead of once per child.

Both are stored in the caches' `DiskCache` (checked by hash, written atomically, the least recently used
pruned): one entry per Triton cache folder, keyed by its name (Triton's own key of source, specialisation,
target and compiler), the GPU model and Triton's version, and one list per source digest of the folders its
children compiled. An entry that fails a check is deleted and compiled again by the child that lacks it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

from baselines.problem import default_knobs, render
from gpu_worker.caches import HARNESS_KERNELS, DiskCache, cache_root, gpu_model, moved_group, package_version

#: the store's size on disk; a KDA render's entries are a few MB a shape
MAX_BYTES = 2 << 30
#: what a Triton cache folder may hold (its kernel's files, each named without a folder)
_MAX_FILES = 64


def render_digest(problem, source: str) -> str | None:
    """sha256 of `source` where it is `problem`'s template, or the template rendered at knob values of its
    knob space (a knob the space does not list keeps its default); else None."""
    try:
        template = problem.template()
    except (OSError, NotImplementedError, AttributeError):
        return None
    digest = hashlib.sha256(source.encode()).hexdigest()
    if source == template:
        return digest
    try:
        knobs, defaults, space = default_knobs(source), default_knobs(template), problem.knob_space()
    except Exception:  # noqa: BLE001 - a candidate's KNOBS line may be any text (deep nesting: RecursionError)
        return None
    if not isinstance(knobs, dict) or set(knobs) != set(defaults):
        return None
    for name, value in knobs.items():
        allowed = space.get(name, [defaults[name]])
        if not any(type(value) is type(a) and value == a for a in allowed):  # True is not 1 here
            return None
    try:
        return digest if render(template, knobs) == source else None
    except ValueError:
        return None


def _pack(folder: Path) -> bytes | None:
    """A Triton cache folder's files as one payload: a JSON line of names and sizes, then their bytes."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    if not files or len(files) > _MAX_FILES:
        return None
    blobs = [p.read_bytes() for p in files]
    head = json.dumps([[p.name, len(b)] for p, b in zip(files, blobs)]).encode()
    return head + b"\n" + b"".join(blobs)


def _unpack(payload: bytes) -> dict[str, bytes]:
    head, _, body = payload.partition(b"\n")
    files, at = {}, 0
    for name, size in json.loads(head):
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad file name {name!r}")
        files[name] = body[at:at + size]
        at += size
    if at != len(body):
        raise ValueError("sizes do not add up")
    return files


def _group_kernel(folder: Path) -> str | None:
    """The kernel a Triton cache folder holds (its `__grp__NAME.json`), or None where it holds no group."""
    for p in folder.glob("__grp__*.json"):
        return p.name[len("__grp__"):-len(".json")]
    return None


class RenderKernels:
    """The store of the template's compiled entries (one per GPU model and Triton version) under the cache
    root; `seed` and `harvest` take a child's Triton cache folder."""

    def __init__(self, settings, cuda: bool):
        self.disk = DiskCache(cache_root(settings), "render-kernels", MAX_BYTES)
        self.base = {"gpu": (gpu_model(cuda) or "unknown-gpu").split(", driver")[0],
                     "triton": package_version("triton")}  # as installed, without importing it in the worker
        self._lock = threading.Lock()  # one index update at a time (the children of a source end together)

    def _index_key(self, digest: str) -> dict:
        return {"kind": "render-source", "source": digest, **self.base}

    def _entry_key(self, name: str) -> dict:
        return {"kind": "render-entry", "entry": name, **self.base}

    def seed_source(self, problem, source: str, own: str | os.PathLike) -> tuple[str | None, int]:
        """`seed` where `source` is a render of `problem`'s template: (its digest, or None where it is not
        one; the entries copied)."""
        digest = render_digest(problem, source)
        return digest, (self.seed(digest, own) if digest else 0)

    def seed(self, digest: str, own: str | os.PathLike) -> int:
        """Copy the entries the source `digest` compiled before into a child's Triton cache `own`, before it
        loads; an entry already there is left, a missing or corrupt one is dropped from the list (the child
        compiles it, and its harvest stores it again). Returns the entries copied."""
        names = self.disk.get_json(self._index_key(digest)) or []
        own, copied, kept = Path(own), 0, []
        for name in names:
            dst = own / name
            if dst.exists():
                kept.append(name)
                continue
            raw = self.disk.get(self._entry_key(name))
            try:
                files = _unpack(raw) if raw is not None else None
            except (ValueError, TypeError):
                files = None
            if files is None:
                continue
            kept.append(name)
            tmp = own / f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
            try:
                tmp.mkdir(parents=True)
                for fname, data in files.items():
                    (tmp / fname).write_bytes(moved_group(data, dst).encode() if fname.startswith("__grp__") else data)
                os.replace(tmp, dst)
                copied += 1
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                shutil.rmtree(tmp, ignore_errors=True)
        if len(kept) != len(names):
            with self._lock:
                self.disk.put_json(self._index_key(digest), sorted(kept))
        return copied

    def harvest(self, digest: str, own: str | os.PathLike) -> int:
        """Store the entries a child of the source `digest` holds in its Triton cache `own` (after its
        compile; the harness's own kernels, seeded from the trusted cache, are not the source's) and list
        them under it. Returns the entries stored anew."""
        own, stored, names = Path(own), 0, []
        if not own.is_dir():
            return 0
        for folder in sorted(own.iterdir()):
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            kernel = _group_kernel(folder)
            if kernel is None or kernel in HARNESS_KERNELS:
                continue  # a folder still being written (no group yet), or the harness's
            names.append(folder.name)
            key = self._entry_key(folder.name)
            if self.disk.path(key).exists():
                continue
            try:
                payload = _pack(folder)
            except OSError:
                payload = None
            if payload is not None and self.disk.put(key, payload) is not None:
                stored += 1
        if names:
            with self._lock:
                listed = self.disk.get_json(self._index_key(digest)) or []
                if set(names) - set(listed):
                    self.disk.put_json(self._index_key(digest), sorted(set(listed) | set(names)))
        return stored
