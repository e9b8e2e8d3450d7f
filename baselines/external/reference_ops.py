"""The operator's core of a problem file, as the static rules see it: what its Model calls, less plumbing.
AST only, no torch: the rules (rules/check.py) read it for a `file:` problem."""

from __future__ import annotations

import ast
import re

from baselines.external.file import FILE_PREFIX
from baselines.parse import parse as parse_source

#: calls in a reference's forward that shape, move or allocate data rather than compute the operator: a
#: candidate's wrapper needs them, so they are never the operator's core
PLUMBING = frozenset({
    "view", "view_as", "reshape", "reshape_as", "contiguous", "size", "dim", "numel", "stride", "float", "half",
    "bfloat16", "double", "long", "int", "bool", "to", "type", "type_as", "t", "transpose", "permute", "movedim",
    "swapaxes", "expand", "expand_as", "broadcast_to", "unsqueeze", "squeeze", "flatten", "unflatten", "clone",
    "detach", "cpu", "cuda", "item", "tolist", "empty", "empty_like", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "arange", "tensor", "as_tensor", "new_empty", "new_zeros", "new_ones", "new_full",
    "copy_", "fill_", "zero_", "is_contiguous", "element_size", "unbind", "split", "chunk", "narrow", "select",
    "cat", "stack", "super", "__init__", "append", "range", "len", "isinstance", "tuple", "list", "parameter"})


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def reference_ops(data: bytes) -> frozenset[str]:
    """The operator's core as the static rules see it: the names the file's Model calls (methods and torch
    functions in forward, `torch.nn` modules built in __init__, as their functional names), less PLUMBING.
    A candidate may not call them: the reference's own torch ops are what it replaces. AST only, no torch."""
    tree = parse_source(data)
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    ops: set[str] = set()
    for fn in (n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                continue  # self.layer(x): a submodule; its class is counted where __init__ builds it
            if fn.name == "forward":
                ops.add(node.func.attr)
            elif fn.name == "__init__" and node.func.attr[:1].isupper():  # nn.Softmax(dim=1) -> softmax
                snake = _snake(node.func.attr)
                ops.update({snake, re.sub(r"_?\d+d$", "", snake)})
    return frozenset(ops - PLUMBING)


_OPS: dict[str, frozenset] = {}


def reference_ops_for_key(key: str) -> frozenset[str]:
    """reference_ops of the problem file stored under `key` (cached: a key names one content)."""
    from workflows.artifacts import ArtifactStore

    if key not in _OPS:
        _OPS[key] = reference_ops(ArtifactStore().get_bytes(key.removeprefix(FILE_PREFIX)))
    return _OPS[key]
