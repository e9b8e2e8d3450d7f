"""Find problems by folder name, or by the store key of a problem file (`file:<sha256>`) or of a problem folder
outside the project (`folder:<sha256>`) (baselines/external/).
Listing is cheap (no torch); loading imports the problem's spec."""

from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path

from baselines.problem import Problem, UnknownProblem

_ROOT = Path(__file__).parent


def problem_names() -> list[str]:
    return sorted(p.name for p in _ROOT.iterdir() if (p / "spec.py").is_file())


def check_problem_name(name: str) -> str:
    if name.startswith(("file:", "folder:")):
        get_problem(name)  # the file's (folder's) bytes must be in the artifact store and make a problem
        return name
    names = problem_names()
    if name not in names:
        raise UnknownProblem(f"unknown problem {name!r}; known problems: {', '.join(names)}")
    return name


@lru_cache(maxsize=None)
def get_problem(name: str) -> Problem:
    if name.startswith("file:"):
        from baselines.external.file import load_key

        return load_key(name)  # content-addressed: one key, one problem, so caching it is safe
    if name.startswith("folder:"):
        from baselines.external.folder import load_folder_key

        return load_folder_key(name)
    check_problem_name(name)
    return importlib.import_module(f"baselines.{name}.spec").PROBLEM


def problem_at(name: str, shape_index: int, distribution: str | None = None):
    """(problem, shape, distribution) for a tool's arguments: shape by its index, the distribution by name
    (default: the problem's first); ValueError (UnknownProblem for a name) with one clear message."""
    check_problem_name(name)
    p = get_problem(name)
    if not 0 <= shape_index < len(p.shapes):
        raise ValueError(f"--shape {shape_index}: {name} has shapes 0..{len(p.shapes) - 1}")
    dist = distribution or p.distributions[0]
    if dist not in p.distributions:
        raise ValueError(f"--dist {dist}: {name}'s distributions are {', '.join(p.distributions)}")
    return p, p.shapes[shape_index], dist
