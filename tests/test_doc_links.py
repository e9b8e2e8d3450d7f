"""Every relative link in the README and docs/ points to a file or folder inside the repository."""

from __future__ import annotations

import re
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


#: code and configuration that name documentation pages by path, from the repository's root
CODE = sorted(p for p in ROOT.rglob("*")
              if p.is_file() and (p.suffix in (".py", ".toml", ".yml", ".yaml") or p.name == "Makefile")
              and not {".git", ".venv", "node_modules", "__pycache__"} & set(p.relative_to(ROOT).parts)
              and p != Path(__file__).resolve())
DOC_PATH = re.compile(r"(?<![\w./-])docs/[\w./-]+?\.md\b")


def doc_paths(text: str) -> list[str]:
    """The docs/*.md paths a code or configuration file names (from the repository's root)."""
    return DOC_PATH.findall(text)


def test_doc_path_finder():
    text = 'see docs/llm.md, "docs/results.md" (docs/sub/x.md#a); not mydocs/y.md or ../docs/z.md or docs/.'
    assert doc_paths(text) == ["docs/llm.md", "docs/results.md", "docs/sub/x.md"]


@pytest.mark.parametrize("path", CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_names_only_docs_that_exist(path):
    missing = [d for d in doc_paths(path.read_text(errors="replace")) if not (ROOT / d).is_file()]
    assert not missing, f"{path.relative_to(ROOT)} names documentation that is not in the repository: {missing}"
