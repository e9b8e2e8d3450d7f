"""A problem folder outside the project: the richer form of a problem, laid out like a built-in one (spec.py
defining PROBLEM, and whatever it imports beside it). Its files live in the artifact store under a
manifest; the problem's name is `folder:<sha256 of the manifest>` (docs/problems.md)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path

from baselines.problem import Problem, ProblemFileError, UnknownProblem

FOLDER_PREFIX = "folder:"
FOLDER_KEY_RE = re.compile(r"^folder:[0-9a-f]{64}$")


def is_folder_key(name: str) -> bool:
    return bool(FOLDER_KEY_RE.match(name or ""))


def folder_manifest(files: dict[str, bytes]) -> tuple[str, dict]:
    """(key, manifest) of a folder's files: the manifest names each file's content key; the key is the
    manifest's own content key, as the artifact store computes it (put_json)."""
    import json

    manifest = {"kind": "problem-folder", "files": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(files.items())}}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return FOLDER_PREFIX + hashlib.sha256(text).hexdigest(), manifest


def read_folder(path: str | os.PathLike) -> dict[str, bytes]:
    """The folder's top-level .py files (subfolders are not part of a problem folder)."""
    p = Path(path)
    try:
        files = {f.name: f.read_bytes() for f in sorted(p.iterdir()) if f.is_file() and f.suffix == ".py"}
    except OSError as e:
        raise ProblemFileError(f"{path}: cannot read the folder: {e.strerror or e}") from None
    if "spec.py" not in files:
        raise ProblemFileError(f"{path}: a problem folder needs a spec.py defining PROBLEM (docs/problems.md)")
    return files


def load_folder(root: Path, key: str, label: str) -> Problem:
    """spec.py's PROBLEM, imported as a package from `root` (its siblings are imported relatively:
    `from .oracle import ...`), named by `key` and reading its template and knobs from `root`."""
    import importlib

    pkg = "marathon_folder_" + key.removeprefix(FOLDER_PREFIX)[:16]
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(root)]
        mod.__file__ = str(root / "__init__.py")
        sys.modules[pkg] = mod
    try:
        spec = importlib.import_module(f"{pkg}.spec")
    except SyntaxError as e:
        raise ProblemFileError(f"{label}: {Path(e.filename or 'spec.py').name}: syntax error at line {e.lineno}: "
                               f"{e.msg}") from None
    except Exception as e:  # noqa: BLE001 - the folder's fault, said in one line
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            del sys.modules[name]
        raise ProblemFileError(f"{label}: importing spec.py raised {type(e).__name__}: {e}") from None
    p = getattr(spec, "PROBLEM", None)
    if not isinstance(p, Problem):
        raise ProblemFileError(f"{label}: spec.py defines no PROBLEM (an instance of baselines.problem.Problem)")
    if not p.shapes or not p.distributions or not p.outputs:
        raise ProblemFileError(f"{label}: PROBLEM needs shapes, distributions and outputs")
    if getattr(p, "name", "") != key:
        p.own_name = p.name
        p.name = key  # workers and children find it by this key
    # the template and the knobs are read from the folder, wherever it lies
    p.__class__ = type(type(p).__name__, (type(p),), {"folder": property(lambda self: root)})
    return p


def load_folder_key(key: str, store=None) -> Problem:
    """The problem folder stored under `key` (`folder:<sha256 of its manifest>`), materialized once in a
    folder of its own (written whole, then renamed) and imported from there."""
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    if not is_folder_key(key):
        raise UnknownProblem(f"{key!r} is not a problem folder key (folder:<64 hex digits>)")
    store = store or ArtifactStore()
    digest = key.removeprefix(FOLDER_PREFIX)
    try:
        manifest = store.get_json(digest)
        files = {n: store.get_bytes(k) for n, k in manifest["files"].items()}
    except ArtifactStoreError as e:
        raise UnknownProblem(f"problem {key[:19]}...: {e} (marathon start PATH stores the folder)") from None
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UnknownProblem(f"problem {key[:19]}...: the stored object is not a problem folder") from None
    root = Path(tempfile.gettempdir()) / f"marathon-problems-{os.getuid()}" / f"folder-{digest}"
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".tmp-"))
        for n, d in files.items():
            (tmp / Path(n).name).write_bytes(d)
        try:
            os.replace(tmp, root)
        except OSError:  # another process got there first: same content
            shutil.rmtree(tmp, ignore_errors=True)
    return load_folder(root, key, key[:19])


