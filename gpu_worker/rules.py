"""Static rules for candidate sources (AST only: no torch import, no execution).

`check_source(source, problem)` returns a RuleReport naming the first rule broken. The same rule names
appear in run-time rejections from the sandbox guard (gpu_worker.guard), so a proposer sees one vocabulary:

  syntax            the source does not parse
  contract          no top-level `def run(inputs, out)`
  forbidden-import  an import outside the allowlist (kernel libraries, the project's baselines, os, sys, ...)
  library-kernel    work handed to library kernels (torch.ops, torch.compile, SDPA, cuBLAS matmul, the
                    problem's own PyTorch op such as torch.softmax for the softmax problem)
  escape            introspection or dynamic code that could defeat the checks (exec, eval, getattr,
                    __import__, __globals__, __dict__, open, ...)
  stream            CUDA streams, events, graphs or synchronisation games with the timer
  thread            threads, processes, subprocesses, sockets
  output-cache      pointer-, identity- or version-keyed caching (data_ptr, id(), _version, storage)
  fallback          try/except (a kernel that falls back to a library when it fails)
  tensor-subclass   a Tensor subclass or __torch_function__/__torch_dispatch__ override (lazy outputs)
"""

from __future__ import annotations

import ast

from workflows.contracts import RuleReport

#: modules (and their submodules) a candidate may import
ALLOWED_IMPORTS = (
    "torch", "triton", "triton.language", "math", "functools", "typing", "itertools", "operator",
    "dataclasses", "__future__", "collections", "enum",
)
#: third-party kernel libraries, named so that the rejection says which rule applies
KERNEL_LIBRARIES = (
    "fla", "flash_attn", "flashinfer", "xformers", "sglang", "vllm", "deep_gemm", "flash_mla",
    "liger_kernel", "tilelang", "flash_kda", "cutlass", "apex", "transformer_engine", "thunderkittens",
    "baselines", "gpu_worker", "activities", "workflows",
)
#: sandbox escapes by import
SYSTEM_MODULES = {
    "os": "escape", "sys": "escape", "subprocess": "thread", "socket": "thread", "threading": "thread",
    "multiprocessing": "thread", "concurrent": "thread", "asyncio": "thread", "ctypes": "escape",
    "cffi": "escape", "importlib": "escape", "inspect": "escape", "gc": "escape", "pickle": "escape",
    "marshal": "escape", "builtins": "escape", "shutil": "escape", "pathlib": "escape", "io": "escape",
    "signal": "escape", "pty": "thread", "runpy": "escape", "code": "escape", "types": "escape",
}
#: attribute chains that hand work to library kernels or defeat the timer; matched on dotted prefixes
FORBIDDEN_ATTRS = {
    "torch.ops": "library-kernel",
    "torch.compile": "library-kernel",
    "torch._dynamo": "library-kernel",
    "torch._inductor": "library-kernel",
    "torch.library": "library-kernel",
    "torch.utils.cpp_extension": "library-kernel",
    "torch.nn.functional.scaled_dot_product_attention": "library-kernel",
    "torch.backends": "library-kernel",
    "torch._C": "escape",
    "torch.overrides": "tensor-subclass",
    "torch.utils._python_dispatch": "tensor-subclass",
    "torch.cuda.Stream": "stream", "torch.cuda.stream": "stream", "torch.cuda.Event": "stream",
    "torch.cuda.graph": "stream", "torch.cuda.CUDAGraph": "stream", "torch.cuda.set_stream": "stream",
    "torch.cuda.synchronize": "stream", "torch.cuda.current_stream": "stream",
    "torch.cuda.default_stream": "stream", "torch.cuda.ExternalStream": "stream",
    "torch.Stream": "stream", "torch.Event": "stream",
    "torch.multiprocessing": "thread", "torch.distributed": "thread",
    "torch.hub": "escape", "torch.load": "escape", "torch.save": "escape", "torch.utils": "escape",
    "triton.runtime": "escape", "triton.compiler": "escape", "triton.backends": "escape",
    "triton._C": "escape", "triton.testing": "stream", "triton.knobs": "escape",
}
#: the matmul family: cuBLAS-backed for the operator's core
MATMUL_NAMES = {"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "einsum", "linear", "bilinear",
                "tensordot", "chain_matmul", "addmv", "mv", "inner", "outer", "dot", "vdot", "kron"}
#: per problem: PyTorch ops that *are* the operator (calling them is the library doing the work)
PROBLEM_OPS = {
    "softmax": {"softmax", "log_softmax", "_softmax", "softmin"},
    "kda": {"scaled_dot_product_attention", "softmax", "triangular_solve",
            "solve_triangular", "inverse", "linalg"},
    "mla": {"scaled_dot_product_attention", "softmax", "log_softmax", "logsumexp"},
}
#: builtins and dunders that defeat a static check
ESCAPE_NAMES = {"exec", "eval", "compile", "__import__", "getattr", "setattr", "delattr", "globals",
                "locals", "vars", "open", "breakpoint", "input", "memoryview", "super", "object", "type"}
ESCAPE_ATTRS = {"__globals__", "__dict__", "__class__", "__subclasses__", "__bases__", "__mro__",
                "__builtins__", "__code__", "__closure__", "__getattribute__", "__setattr__", "__import__",
                "__loader__", "__spec__", "f_globals", "f_locals", "f_back", "gi_frame", "__self__",
                "__func__", "__wrapped__", "__reduce__", "__reduce_ex__", "__init_subclass__"}
CACHE_ATTRS = {"data_ptr", "_version", "untyped_storage", "storage", "_cdata", "storage_offset",
               "unsafe_chunk", "_base"}
CACHE_NAMES = {"id", "hash"}
SUBCLASS_ATTRS = {"__torch_function__", "__torch_dispatch__", "as_subclass", "_make_subclass",
                  "_make_wrapper_subclass"}
THREAD_NAMES = {"Thread", "Process", "Popen", "system", "fork"}


def _problem_ops(problem: str) -> set[str]:
    for key, ops in PROBLEM_OPS.items():
        if problem == key or problem.startswith(key + "_"):
            return ops
    return set()


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Violation(Exception):
    def __init__(self, rule: str, detail: str):
        super().__init__(detail)
        self.rule, self.detail = rule, detail


def _import_rule(module: str) -> tuple[str, str] | None:
    top = module.split(".")[0]
    for lib in KERNEL_LIBRARIES:
        if module == lib or module.startswith(lib + "."):
            return "forbidden-import", f"import of {module!r}: kernel libraries and the project's own modules are not allowed"
    if top in SYSTEM_MODULES:
        return SYSTEM_MODULES[top], f"import of {module!r} is not allowed in a candidate"
    for ok in ALLOWED_IMPORTS:
        if module == ok or module.startswith(ok + "."):
            dotted_rule = _attr_rule(module)
            if dotted_rule:
                return dotted_rule
            return None
    return "forbidden-import", f"import of {module!r}: allowed are {', '.join(ALLOWED_IMPORTS)}"


def _attr_rule(dotted: str) -> tuple[str, str] | None:
    for prefix, rule in FORBIDDEN_ATTRS.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return rule, f"use of {dotted!r} is not allowed ({rule})"
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, problem: str):
        self.ops = _problem_ops(problem)
        self.aliases: dict[str, str] = {}  # local name -> dotted module/object it stands for

    def fail(self, rule: str, node: ast.AST, what: str):
        line = getattr(node, "lineno", "?")
        raise _Violation(rule, f"line {line}: {what}")

    # imports ---------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import):
        for a in node.names:
            r = _import_rule(a.name)
            if r:
                self.fail(r[0], node, r[1])
            self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level:
            self.fail("forbidden-import", node, "relative imports are not allowed")
        mod = node.module or ""
        r = _import_rule(mod)
        if r:
            self.fail(r[0], node, r[1])
        for a in node.names:
            if a.name == "*":
                self.fail("escape", node, f"'from {mod} import *' is not allowed")
            full = f"{mod}.{a.name}"
            r = _attr_rule(full) or self._name_rule(a.name, node, full)
            if r:
                self.fail(r[0], node, r[1])
            self.aliases[a.asname or a.name] = full

    def _name_rule(self, name: str, node, full: str):
        if name in MATMUL_NAMES and full.startswith("torch"):
            return "library-kernel", f"{full!r}: cuBLAS-backed matmul may not do the operator's core"
        if name in self.ops and full.startswith("torch"):
            return "library-kernel", f"{full!r} is the library's implementation of this operator"
        return None

    # names and attributes --------------------------------------------------------------------
    def _resolve(self, node: ast.AST) -> str | None:
        d = _dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def visit_Attribute(self, node: ast.Attribute):
        if node.attr in ESCAPE_ATTRS:
            self.fail("escape", node, f"attribute {node.attr!r} is not allowed")
        if node.attr in CACHE_ATTRS:
            self.fail("output-cache", node, f"attribute {node.attr!r}: pointer/version-keyed state is not allowed")
        if node.attr in SUBCLASS_ATTRS:
            self.fail("tensor-subclass", node, f"{node.attr!r} is not allowed")
        full = self._resolve(node)
        if full:
            r = _attr_rule(full)
            if r:
                self.fail(r[0], node, r[1])
        if node.attr in MATMUL_NAMES and (full is None or not full.startswith(("tl.", "triton.language."))):
            if not (full and (full.startswith("triton.language") or full.split(".")[0] in ("tl",))):
                self.fail("library-kernel", node, f".{node.attr}: cuBLAS-backed matmul may not do the operator's core")
        if node.attr in self.ops and not (full and full.startswith("triton.language")):
            self.fail("library-kernel", node, f".{node.attr} is the library's implementation of this operator")
        if node.attr in THREAD_NAMES:
            self.fail("thread", node, f"{node.attr!r} is not allowed")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if node.id in ESCAPE_NAMES:
            self.fail("escape", node, f"{node.id!r} is not allowed")
        if node.id in CACHE_NAMES:
            self.fail("output-cache", node, f"{node.id}() is not allowed (identity-keyed caching)")
        if node.id in ("__builtins__", "__loader__", "__spec__", "__file__"):
            self.fail("escape", node, f"{node.id!r} is not allowed")
        full = self.aliases.get(node.id)
        if full:
            r = _attr_rule(full)
            if r:
                self.fail(r[0], node, r[1])
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp):
        if isinstance(node.op, ast.MatMult):
            self.fail("library-kernel", node, "'@' on tensors is a cuBLAS matmul; use tl.dot inside a kernel")
        self.generic_visit(node)

    def _check_target(self, t: ast.AST):
        if isinstance(t, (ast.Attribute, ast.Subscript)):
            base = t.value
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                full = self.aliases.get(base.id, base.id)
                if full.split(".")[0] in ("torch", "triton", "math", "functools", "itertools", "operator"):
                    self.fail("escape", t, f"assignment into {ast.unparse(t)!r}: library objects may not be modified")
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e)

    def visit_Assign(self, node: ast.Assign):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign):
        if isinstance(node.op, ast.MatMult):
            self.fail("library-kernel", node, "'@=' is a cuBLAS matmul")
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_Try(self, node):
        self.fail("fallback", node, "try/except is not allowed (no fallback paths)")

    visit_TryStar = visit_Try

    def visit_ClassDef(self, node: ast.ClassDef):
        for b in node.bases:
            self.fail("tensor-subclass", node, f"class {node.name} derives from {ast.unparse(b)}; classes with bases are not allowed")
        self.generic_visit(node)

    def visit_Global(self, node):
        self.fail("output-cache", node, "'global' statements are not allowed (state across calls)")

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str):
            for lib in ("fla.", "flash_attn", "flashinfer", "xformers", "vllm", "deep_gemm", "flash_mla",
                        "liger_kernel", "tilelang", "baselines."):
                if lib in node.value:
                    self.fail("forbidden-import", node, f"string mentions {lib!r}")


def check_source(source: str, problem: str) -> RuleReport:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return RuleReport(ok=False, rule="syntax", detail=f"line {e.lineno}: {e.msg}")
    run = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not run:
        return RuleReport(ok=False, rule="contract", detail="no top-level 'def run(inputs, out)'")
    if len(run[0].args.args) != 2:
        return RuleReport(ok=False, rule="contract", detail="run must take exactly (inputs, out)")
    try:
        _Checker(problem).visit(tree)
    except _Violation as v:
        return RuleReport(ok=False, rule=v.rule, detail=v.detail[:2000])
    return RuleReport(ok=True)
