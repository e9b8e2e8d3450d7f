"""Caches that survive a worker's restart: what the reference computes per case (the oracle's outputs, the
baseline's own error, the inputs' fingerprint), the measured ceilings, the self-test's verdict, and Triton's
compiled kernels with the baseline's autotuning choices. They live under the settings' cache directory
(`cache_root`: `cache` in MARATHON_HOME by default), one folder per kind.

An entry is keyed by everything that decides its value (problem, shape, distribution, seed, the code that
computes it, GPU model, torch/Triton/FLA versions): its file is named by the key's digest, and its header
holds the key itself and the payload's sha256. A read checks both and the payload's size; an entry that
fails any check (stale, corrupt, cut short, unreadable) is deleted, logged once per file and process, and
read as absent, so the caller computes the value again and writes it anew. Nothing is trusted unchecked.
Writes are atomic (a temp file in the same folder, renamed into place): a reader sees a whole entry or none,
and writers of the same entry race harmlessly.

Who may write: trusted processes only (the worker, the reference child). Candidate children can write
nowhere but their own temp directory (the OS wall and the run-time guard); the static rules keep them from
reading files at all.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpu_worker.settings import work_root

#: the first line of an entry's file, before its JSON header
MAGIC = b"marathon-cache 1\n"

_logged: set[str] = set()
_logged_lock = threading.Lock()


def key_digest(key: Mapping[str, Any]) -> str:
    """The key's digest: sha256 of its canonical JSON (keys sorted), which names its entry's file."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _log_once(path: Path, why: str) -> None:
    with _logged_lock:
        if str(path) in _logged:
            return
        _logged.add(str(path))
    print(f"cache entry {path} {why}: rebuilt", flush=True)


class DiskCache:
    """One kind of entry (`kind`, a folder of `root`). `max_bytes`: when a write takes the folder past
    it, its least recently used entries (by modification time, which a hit refreshes) are removed."""

    def __init__(self, root: Path, kind: str, max_bytes: float | None = None):
        self.dir = Path(root) / kind
        self.max_bytes = max_bytes

    def path(self, key: Mapping[str, Any]) -> Path:
        return self.dir / (key_digest(key)[:40] + ".entry")

    def get(self, key: Mapping[str, Any]) -> bytes | None:
        """The payload stored under `key`, or None: absent, or failed a check (then deleted and logged)."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                if f.readline() != MAGIC:
                    return self._bad(path, "has no cache header")
                header = json.loads(f.readline())
                payload = f.read()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            return self._bad(path, f"unreadable ({type(e).__name__})")
        if not isinstance(header, dict) or header.get("key") != json.loads(json.dumps(key, default=str)):
            return self._bad(path, "holds another key")
        if header.get("size") != len(payload) or header.get("sha256") != hashlib.sha256(payload).hexdigest():
            return self._bad(path, "is corrupt (size or hash)")
        try:
            os.utime(path)  # recently used: pruned last
        except OSError:
            pass
        return payload

    def _bad(self, path: Path, why: str) -> None:
        _log_once(path, why)
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def put(self, key: Mapping[str, Any], payload: bytes) -> Path | None:
        """Store `payload` under `key`, atomically; None (and a line in the log) if the disk refuses: a
        cache that cannot be written costs time, never a verdict."""
        path = self.path(key)
        header = {"key": key, "size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        tmp = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC)
                f.write(json.dumps(header, sort_keys=True, default=str).encode() + b"\n")
                f.write(payload)
            os.replace(tmp, path)
        except OSError as e:
            print(f"cache write {path} failed: {e}", flush=True)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return None
        if self.max_bytes is not None:
            self.prune(self.max_bytes, keep=path)
        return path

    def prune(self, max_bytes: float, keep: Path | None = None) -> int:
        """Remove the least recently used entries until the folder holds at most `max_bytes` (never `keep`,
        the entry just written). Returns how many were removed."""
        for p in self.dir.glob(".tmp-*"):  # a writer killed mid-write (a child closed with its queue unwritten)
            try:
                if time.time() - p.stat().st_mtime > 3600:
                    p.unlink()
            except OSError:
                pass
        entries = []
        for p in self.dir.glob("*.entry"):
            try:
                st = p.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        removed = 0
        for _, size, p in sorted(entries):
            if total <= max_bytes:
                break
            if p == keep:
                continue
            try:
                p.unlink()
            except OSError:
                continue
            total -= size
            removed += 1
        return removed

    # --- typed payloads ---------------------------------------------------------------------------
    def get_json(self, key: Mapping[str, Any]) -> Any:
        raw = self.get(key)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return self._bad(self.path(key), "holds no JSON")

    def put_json(self, key: Mapping[str, Any], value: Any) -> Path | None:
        return self.put(key, json.dumps(value, sort_keys=True).encode())

    def get_tensors(self, key: Mapping[str, Any]) -> Any:
        """A torch.save'd value (tensors on the CPU), read with weights_only: no code runs from an entry."""
        raw = self.get(key)
        if raw is None:
            return None
        import torch

        try:
            return torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
        except Exception:  # noqa: BLE001 - its hash held, so a torch that reads it no longer: rebuilt
            return self._bad(self.path(key), "does not load")

    def put_tensors(self, key: Mapping[str, Any], value: Any) -> Path | None:
        import torch

        buf = io.BytesIO()
        torch.save(value, buf)
        return self.put(key, buf.getvalue())


# --- what a key is made of ------------------------------------------------------------------------

def cache_root(settings) -> Path:
    """The settings' cache directory (MARATHON_CACHE_DIR; `GpuWorkerSettings.from_env` makes it `cache` in
    MARATHON_HOME when unset); settings built in code without one keep their caches in their GPU work
    directory (tests, scripts), never in the user's home."""
    if settings.cache_dir is not None:
        return Path(settings.cache_dir)
    return work_root(settings.gpu_workdir) / "cache"


def code_tag(files: Iterable[str | os.PathLike]) -> str | None:
    """A digest of the files' contents (in the order given), or None if one cannot be read: then nothing
    it would key is cached."""
    h = hashlib.sha256()
    try:
        for f in files:
            h.update(str(Path(f).name).encode())
            h.update(Path(f).read_bytes())
    except OSError:
        return None
    return h.hexdigest()[:24]


def problem_files(problem) -> list[Path] | None:
    """The source files that decide a problem's inputs, oracle and baseline: every module of its package
    folder and the shared problem modules; None where its class has no file."""
    import sys

    mod = sys.modules.get(type(problem).__module__)
    f = getattr(mod, "__file__", None)
    if not f:
        return None
    here = Path(f).resolve().parent
    base = Path(__file__).resolve().parent.parent / "baselines"
    return sorted(here.glob("*.py")) + [base / "problem.py", base / "perturb.py"]


def package_version(dist: str) -> str | None:
    """An installed distribution's version, without importing it (only the KDA adapter imports FLA)."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """torch, Triton and FLA as installed, and CUDA as torch was built for it."""
    import torch
    import triton

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "fla": package_version("fla-core") or package_version("flash-linear-attention")}


@functools.lru_cache(maxsize=None)
def gpu_model(cuda: bool) -> str | None:
    """This worker's GPU (the first one it sees) and its driver, asked of nvidia-smi so that the worker
    makes no CUDA context of its own: `NVIDIA H200, driver 570.124.06`; `cpu` without CUDA; None where it
    cannot be told (then nothing keyed by it is cached)."""
    if not cuda:
        return "cpu"
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader",
                            "-i", visible], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    line = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else ""
    parts = [p.strip() for p in line.split(",")]
    return f"{parts[0]}, driver {parts[1]}" if len(parts) == 2 and all(parts) else None


def slug(text: str) -> str:
    """A folder name for `text` (a GPU model)."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:80] or "unknown"


def triton_cache_dir(settings, cuda: bool) -> Path:
    """Where trusted children keep Triton's compiled kernels and autotuning choices (TRITON_CACHE_DIR,
    with TRITON_CACHE_AUTOTUNING): per GPU model under the cache root, since Triton keys its autotuning
    choices by the architecture alone and an H100's are not an H200's."""
    model = gpu_model(cuda) or "unknown-gpu"
    d = cache_root(settings) / "triton" / slug(model.split(", driver")[0])
    d.mkdir(parents=True, exist_ok=True)
    return d


#: the harness's own Triton kernels that run in a candidate's child (the timing refill's, baselines.perturb_kernels)
HARNESS_KERNELS = ("_perturb_elementwise", "_perturb_rows")


def moved_group(group: bytes, dst: Path) -> str:
    """A Triton cache folder's `__grp__` file for its copy at `dst`: a group names its files by absolute
    path, and the copy's must be the copy's own."""
    paths = json.loads(group)["child_paths"]
    return json.dumps({"child_paths": {c: str(dst / Path(f).name) for c, f in paths.items()}})


def seed_harness_kernels(own: str | os.PathLike, trusted: str | os.PathLike, names=HARNESS_KERNELS) -> int:
    """Copy the trusted Triton cache's compiled entries of the harness's own kernels into a candidate child's
    own cache (its TRITON_CACHE_DIR), before the candidate loads: the child loads them instead of compiling
    them inside a device turn. Only trusted children write `trusted`; an entry already there, or one that
    cannot be read whole, is left (the child compiles what it lacks). Returns the entries copied."""
    import shutil

    copied = 0
    for grp in Path(trusted).glob("*/__grp__*.json"):
        if grp.name[len("__grp__"):-len(".json")] not in names:
            continue
        dst = Path(own) / grp.parent.name
        if dst.exists():
            continue
        tmp = Path(own) / f".{grp.parent.name}.{os.getpid()}.tmp"
        try:
            group = moved_group(grp.read_bytes(), dst)
            shutil.copytree(grp.parent, tmp)
            (tmp / grp.name).write_text(group)
            os.replace(tmp, dst)
            copied += 1
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            shutil.rmtree(tmp, ignore_errors=True)
    return copied


def host_key() -> dict[str, str]:
    return {"host": socket.gethostname()}


def ceilings_key(device: str) -> dict:
    """What decides the measured ceilings (child.reference.cmd_ceilings): the GPU (`device`, its name), the
    host, torch and CUDA; a card's copy bandwidth and matmul rate do not change between a worker's starts."""
    return {"kind": "ceilings", "device": device, **host_key(),
            **{k: v for k, v in versions().items() if k in ("torch", "cuda")}}


class BackgroundWriter:
    """Writes entries on a thread of its own, in order, so that a process inside a device turn (the
    reference child computing oracles) does not spend the turn hashing and writing files. The thread is not
    a daemon: a process that exits normally first finishes what it queued; one that is killed loses it, and
    the entry is computed again next time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list = []
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> None:
        with self._lock:
            self._queue.append((fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cache-writer")
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._thread = None
                    return
                fn, args = self._queue.pop(0)
            try:
                fn(*args)
            except Exception as e:  # noqa: BLE001 - a cache that cannot be written costs time only
                print(f"cache write failed: {type(e).__name__}: {e}", flush=True)

    def flush(self, timeout: float = 60.0) -> None:
        """Until everything submitted is written (tests; a process about to exit)."""
        with self._lock:
            t = self._thread
        if t is not None:
            t.join(timeout)


class ReferenceCaseCache:
    """Per case of one (problem, shape) in a reference child: the oracle's outputs, the inputs' fingerprint
    and the baseline's own error (None where the baseline was not run). `base`: the key's part common to
    the cases (see `reference_key`); None: nothing is cached (a random shape, code that cannot be read)."""

    def __init__(self, root: Path, base: dict | None, max_bytes: float | None):
        self.base = base
        self.disk = DiskCache(root, "oracles", max_bytes)
        self.writer = BackgroundWriter()

    @property
    def enabled(self) -> bool:
        return self.base is not None

    def key(self, dist: str, seed: int) -> dict:
        return {**(self.base or {}), "dist": dist, "seed": int(seed)}

    def get(self, dist: str, seed: int) -> dict | None:
        """{"hash", "baseline_err", "oracle": {output: CPU tensor}} or None."""
        if not self.enabled:
            return None
        v = self.disk.get_tensors(self.key(dist, seed))
        if v is not None and not (isinstance(v, dict) and isinstance(v.get("hash"), str)
                                  and isinstance(v.get("oracle"), dict)):
            return self.disk._bad(self.disk.path(self.key(dist, seed)), "holds no reference case")
        return v

    def put(self, dist: str, seed: int, fingerprint: str, baseline_err: float | None, oracle: dict) -> None:
        """Stored in the background (the oracle's outputs already copied to the CPU by the caller)."""
        if self.enabled:
            value = {"hash": fingerprint, "baseline_err": baseline_err, "oracle": oracle}
            self.writer.submit(self.disk.put_tensors, self.key(dist, seed), value)


def reference_key(problem, shape, outputs, cpu_mode: bool, inputs_tag: str | None, baseline: str,
                  device: str) -> dict | None:
    """What decides a reference case's values besides its distribution and seed: the problem and shape,
    the compared outputs, the input generator's tag (child.core.generator_tag), the problem's code, the
    baseline, torch/Triton/FLA, and the device (`device`: its name; `cpu`). None where something cannot be
    told, or for a random shape (secret seeds, each used once)."""
    from baselines.problem import RANDOM_SHAPE

    files = problem_files(problem)
    code = code_tag(files) if files else None
    if inputs_tag is None or code is None or shape.name.startswith(RANDOM_SHAPE):
        return None
    return {"kind": "reference-case", "problem": problem.name, "shape": shape.name,
            "params": dict(getattr(shape, "params", {}) or {}), "outputs": list(outputs), "cpu_mode": cpu_mode,
            "inputs": inputs_tag, "code": code, "baseline": baseline, "device": device, **versions()}
