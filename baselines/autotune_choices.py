"""A baseline's autotuning choices, captured on one GPU model and shipped, so that an empty host of that
model does not autotune before its first verdict (FLA's first KDA call spends a minute or more there).

A choice is, for one Triton `Autotuner` (named `module.global`) and one of its tuning keys, the config it
picked. Seeding puts that choice into the autotuner's in-memory cache before the first call, where Triton
looks first, so the call compiles the chosen config alone and benchmarks none. A choice is only ever one
of the autotuner's own configs (matched by every field Triton compiles from); a choice whose config the
autotuner no longer lists, or a document captured with another GPU model, Triton or library version, is
not used, and Triton autotunes as it would have. Keys the document does not hold are tuned as usual.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the document's format; another format is not read
FORMAT = 1

#: the fields of a triton.Config that decide what is compiled
_CONFIG_FIELDS = ("kwargs", "num_warps", "num_stages", "num_ctas", "maxnreg", "ir_override")


def gpu_file_name(gpu: str) -> str:
    """The shipped document's file name for a GPU model (`torch.cuda.get_device_name`)."""
    return (re.sub(r"[^0-9A-Za-z.]+", "-", gpu).strip("-") or "unknown-gpu") + ".json"


def autotuners(prefix: str) -> dict[str, Any]:
    """Every Triton Autotuner among the globals of the loaded modules named `prefix` or under it, named by
    its function's defining module and name (one imported into several modules is one autotuner); one
    wrapped by heuristics is found through its `fn`."""
    from triton.runtime.autotuner import Autotuner

    found: dict[str, Any] = {}
    for mod_name, mod in sorted(sys.modules.items()):
        if mod is None or not (mod_name == prefix or mod_name.startswith(prefix + ".")):
            continue
        for obj in list(vars(mod).values()):
            for _ in range(4):  # heuristics(autotune(jit)): a short chain of wrappers
                if isinstance(obj, Autotuner):
                    fn = obj.fn
                    while not inspect.isfunction(fn):  # the jit function, then its Python function
                        fn = fn.fn
                    found.setdefault(f"{fn.__module__}.{fn.__qualname__}", obj)
                    break
                try:
                    obj = getattr(obj, "fn", None)
                except Exception:  # noqa: BLE001 - a module's lazy attribute; not a kernel
                    obj = None
                if obj is None:
                    break
    return found


def _config_fields(cfg) -> dict:
    return {f: getattr(cfg, f, None) for f in _CONFIG_FIELDS}


def _plain(value):
    """A key or config field as JSON holds it, or ValueError: a choice that cannot round-trip exactly is
    not captured."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    raise ValueError(f"{type(value).__name__} is not plain data")


def _key(value):
    """A JSON key back as the tuple Triton builds (nested lists as tuples)."""
    return tuple(_key(v) for v in value) if isinstance(value, list) else value


def capture(prefix: str, versions: Mapping[str, str], note: str = "") -> dict:
    """The choices every autotuner under `prefix` has made in this process, as a document for `seed`."""
    kernels: dict[str, list] = {}
    for name, tuner in autotuners(prefix).items():
        rows = []
        for key, cfg in getattr(tuner, "cache", {}).items():
            try:
                rows.append({"key": _plain(list(key)), "config": _plain(_config_fields(cfg))})
            except ValueError:
                continue
        if rows:
            kernels[name] = sorted(rows, key=lambda r: json.dumps(r["key"]))
    return {"format": FORMAT, "versions": dict(versions), "note": note, "kernels": kernels}


@dataclass
class Seeded:
    """What `seed` did: choices put in place, choices passed over (their config no longer listed, or their
    kernel not loaded), and why nothing was used where that is so."""

    used: int = 0
    skipped: int = 0
    refused: str = ""
    kernels: list[str] = field(default_factory=list)


def seed(doc: Mapping, prefix: str, versions: Mapping[str, str]) -> Seeded:
    """Put the document's choices into the loaded autotuners under `prefix`, for a process whose GPU model
    and versions (`versions`) are exactly the document's; never replaces a choice already made."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT or not isinstance(doc.get("kernels"), Mapping):
        return Seeded(refused=f"not a format-{FORMAT} choices document")
    theirs = doc.get("versions")
    if theirs != dict(versions):
        return Seeded(refused=f"captured with {theirs}, this process has {dict(versions)}")
    for name in doc["kernels"]:  # a kernel's module may load lazily, at its first call: loaded here first
        module = str(name).rsplit(".", 1)[0]
        if module.startswith(prefix + ".") and module not in sys.modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # its choices are passed over below
    tuners = autotuners(prefix)
    out = Seeded()
    for name, rows in doc["kernels"].items():
        tuner = tuners.get(name)
        if tuner is None or not isinstance(rows, list):
            out.skipped += len(rows) if isinstance(rows, list) else 1
            continue
        own = {}
        for c in tuner.configs:
            try:
                own[json.dumps(_plain(_config_fields(c)), sort_keys=True)] = c
            except ValueError:
                continue  # a config no document can name (a field that is not plain data)
        for row in rows:
            cfg = own.get(json.dumps(row.get("config"), sort_keys=True)) if isinstance(row, Mapping) else None
            if cfg is None or not isinstance(row.get("key"), list):
                out.skipped += 1
                continue
            tuner.cache.setdefault(_key(row["key"]), cfg)
            out.used += 1
            if name not in out.kernels:
                out.kernels.append(name)
    return out


def read(path: Path) -> dict | None:
    """The document at `path`, or None where there is none or it is not JSON (Triton then autotunes)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
