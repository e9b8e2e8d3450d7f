"""Kernel sources in a model's text: a fenced module, or a `source` argument wrapped in fences."""

from __future__ import annotations

import re

from baselines.parse import parse as parse_source

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def extract_code(text: str) -> str | None:
    """The kernel module in a free-text reply: the last fenced Python block that defines `run`, else a
    bare module that does; None if there is none."""
    blocks = [b for lang, b in FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3")]
    with_run = [b for b in blocks if re.search(r"^def run\(", b, re.M)]
    if with_run:
        return with_run[-1].strip("\n") + "\n"
    if not blocks and re.search(r"^def run\(", text, re.M):
        try:
            parse_source(text)  # the whole reply is the module
            return text.strip("\n") + "\n"
        except SyntaxError:
            start = re.search(r"^(import|from|@triton|def|KNOBS)\b", text, re.M)
            return text[start.start() if start else 0:].strip("\n") + "\n"
    return None


def clean_source(source: str) -> str:
    """A `source` argument wrapped in markdown fences is unwrapped."""
    if "```" in source:
        code = extract_code(source)
        if code:
            return code
        source = re.sub(r"^```[^\n]*\n?|```\s*$", "", source.strip())
    return source.strip("\n") + "\n"
