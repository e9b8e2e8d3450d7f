"""Every relative link in the README and docs/ points to a file or folder inside the repository, and every
repository path or module that code, configuration, scripts and documentation name exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

INLINE = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![img](target)
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [label]: target


def relative_links(text: str) -> list[str]:
    """Link targets that name a path: no URL scheme, no bare #anchor; the #fragment is dropped."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold commands, not links
    out = []
    for target in INLINE.findall(text) + REFERENCE.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_link_parser_finds_relative_targets_only():
    text = ("see [a](docs/a.md), ![img](p.png \"t\"), [b](../deploy/k8s/#x), [web](https://x.org/y), "
            "[here](#top), [m](mailto:a@b)\n[ref]: docs/r.md\n```\n[not](in/code.md)\n```\n")
    assert relative_links(text) == ["docs/a.md", "p.png", "../deploy/k8s/", "docs/r.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc):
    broken = []
    for target in relative_links(doc.read_text()):
        path = (doc.parent / target).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to what is not in the repository: {broken}"


def repository_files() -> list[Path]:
    """The files the repository holds: tracked or not yet added, never what git ignores (a venv, a GPU
    bundle, build outputs); without git, every file outside the usual ignored folders."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if (ROOT / line).is_file()]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file()
                and not {".git", ".venv", "node_modules", "__pycache__"} & set(p.relative_to(ROOT).parts)]


#: the files that name repository paths in their text: code, configuration, scripts and documentation
NAMING = sorted(p for p in repository_files()
                if (p.suffix in (".py", ".toml", ".yml", ".yaml", ".sh", ".md") or p.name in ("Makefile", "Dockerfile"))
                and p != Path(__file__).resolve())
#: the repository's top-level folders: a path that starts with one of them is read as a repository path
TOP = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith("."))
#: the packages whose dotted names (workflows.contracts.FAMILIES) are read as module paths; shorter or
#: commoner package names (rules, cli) are also variable names in code
PACKAGES = ("workflows", "activities", "gpu_worker", "baselines")
#: words that look like repository paths and are not: Kubernetes deployments (kubectl ... deploy/NAME)
NOT_PATHS = {"deploy/marathon-agent", "deploy/marathon-gpu"}


def repository_paths(text: str, top: list[str] = TOP) -> list[str]:
    """Paths from the repository's root that a text names: a top-level folder and what follows it, a
    brace list expanded (docs/scoreboard.{md,json}), anything with a wildcard or a placeholder cut at it."""
    pattern = re.compile(r"(?<![\w./~$<{-])(?:%s)/(?:[\w./{},-]*[\w/}])?" % "|".join(map(re.escape, top)))
    out = []
    for match in pattern.finditer(text):
        found = match[0]
        if text[match.end():match.end() + 1] in ("*", "<"):  # memo_*.py, <problem>: the folder before it
            found = found.rpartition("/")[0] + "/"
        brace = re.fullmatch(r"(.*)\{([\w.,-]+)\}(.*)", found)
        for path in ([brace[1] + alt + brace[3] for alt in brace[2].split(",")] if brace else [found]):
            path = path.split("{")[0].rstrip(".")
            if path not in NOT_PATHS and path not in out:
                out.append(path)
    return out


def module_paths(text: str) -> list[str]:
    """Dotted names under the project's packages that name no module: the first name after the package, and
    each one after a subpackage, must be a module, a subpackage or a word of that package's __init__.py."""
    broken = []
    for dotted in sorted(set(re.findall(r"(?<![\w./])(?:%s)(?:\.[a-z_]\w*)+\b(?!\.\w)" % "|".join(PACKAGES), text))):
        if dotted.rsplit(".", 1)[1] in ("py", "md", "json"):
            continue  # a file name (activities.py), not a module path
        here = ROOT / dotted.split(".")[0]
        for name in dotted.split(".")[1:]:
            if (here / name).is_dir() or (here / f"{name}.py").is_file():
                here = here / name
                continue
            if here.is_dir() and not re.search(rf"\b{name}\b", (here / "__init__.py").read_text()):
                broken.append(dotted)
            break
    return broken


def test_repository_path_finder():
    text = ("see docs/llm.md, `activities/llm/` and docs/scoreboard.{md,json}; baselines/<problem>/spec, "
            "deploy/k8s/*.yaml and kubectl logs deploy/marathon-gpu; not mydocs/y.md, ./x/docs/z.md or ~/docs/w")
    assert repository_paths(text, ["docs", "activities", "baselines", "deploy"]) == [
        "docs/llm.md", "activities/llm/", "docs/scoreboard.md", "docs/scoreboard.json", "baselines/", "deploy/k8s/"]


def test_module_path_finder():
    text = "workflows.contracts.FAMILIES, gpu_worker.guard, activities.llm.prompt, activities.no_such, activities.py"
    assert module_paths(text) == ["activities.no_such"]


@pytest.mark.parametrize("path", NAMING, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_name_only_repository_paths_that_exist(path):
    text = path.read_text(errors="replace")
    missing = [p for p in repository_paths(text) if not (ROOT / p).exists()] + module_paths(text)
    assert not missing, f"{path.relative_to(ROOT)} names what is not in the repository: {missing}"
