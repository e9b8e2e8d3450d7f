"""Static rules for candidate sources (AST only: no torch import, no execution).

`check_source(source, problem)` returns a RuleReport naming the first rule broken. The same rule names
appear in run-time rejections from the sandbox guard (gpu_worker.guard), so a proposer sees one vocabulary.
Where a rule is one of the cheating families (`FAMILIES` in workflows/contracts/base.py) it carries that name:

  syntax            the source does not parse
  contract          no top-level `def run(inputs, out)`
  forbidden-import  an import outside the allowlist (kernel libraries, the project's own modules, numpy, ...)
  library-kernel    work handed to library kernels: torch.ops, torch.compile, SDPA, cuBLAS matmul, the
                    problem's own PyTorch op, and any torch that computes rather than allocates, views,
                    copies, casts or fills (torch.exp, x.sum(), F.relu; rules/torch_ops.py)
  escape            introspection or dynamic code that could defeat the checks: a builtin outside the short
                    allowlist (exec, eval, getattr, vars, globals, type, ...), any attribute whose name starts
                    with an underscore (__dict__, __class__, torch._C), frame and code attributes, and any
                    attribute chain through a module that reaches the interpreter, the operating system or
                    the harness (torch.sys.modules, torch.cuda.os, torch.utils, triton.runtime, ...), and a
                    module object held in a variable, passed or returned (names bound to modules are
                    followed: rules/names.py)
  network           sockets, HTTP and friends
  process           subprocesses, fork, multiprocessing
  filesystem        file access (open, pathlib, shutil, tempfile)
  timer             time, timeit, and assignments into timers (torch.cuda.Event.elapsed_time = ...)
  stream            CUDA streams, events, graphs or synchronisation games with the timer
  output-cache      pointer-, identity- or version-keyed caching (data_ptr, id(), _version, storage,
                    functools.lru_cache), 'global' state
  lazy-output       outputs completed after the call: threads, Tensor subclasses, __torch_function__ /
                    __torch_dispatch__ overrides, torch's function and dispatch modes
  fallback          try/except (a kernel that falls back to a library when it fails)
"""

from __future__ import annotations

import ast
import builtins

from rules.names import ModuleNames
from rules.torch_ops import ALLOWED_TORCH_CALLS, COMPUTE_MODULES, COMPUTE_NAMES, PYTHON_METHODS
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
    "baselines", "gpu_worker", "activities", "workflows", "rules", "cli",
)
#: sandbox escapes by import, by family (any other module outside the allowlist is a forbidden-import)
SYSTEM_MODULES = {
    "os": "escape", "sys": "escape", "posix": "escape", "subprocess": "process", "_posixsubprocess": "process",
    "pty": "process", "multiprocessing": "process", "socket": "network", "_socket": "network", "ssl": "network",
    "http": "network", "urllib": "network", "ftplib": "network", "smtplib": "network", "socketserver": "network",
    "xmlrpc": "network", "asyncio": "lazy-output", "threading": "lazy-output", "_thread": "lazy-output",
    "concurrent": "lazy-output", "sched": "lazy-output", "time": "timer", "timeit": "timer",
    "ctypes": "escape", "cffi": "escape", "importlib": "escape", "inspect": "escape", "gc": "escape",
    "pickle": "escape", "marshal": "escape", "builtins": "escape", "shutil": "filesystem",
    "pathlib": "filesystem", "io": "filesystem", "tempfile": "filesystem", "glob": "filesystem",
    "signal": "escape", "runpy": "escape", "code": "escape", "types": "escape", "weakref": "output-cache",
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
    "torch.overrides": "lazy-output",
    "torch.utils._python_dispatch": "lazy-output",
    "torch.cuda.Stream": "stream", "torch.cuda.stream": "stream", "torch.cuda.Event": "stream",
    "torch.cuda.graph": "stream", "torch.cuda.CUDAGraph": "stream", "torch.cuda.set_stream": "stream",
    "torch.cuda.synchronize": "stream", "torch.cuda.current_stream": "stream",
    "torch.cuda.default_stream": "stream", "torch.cuda.ExternalStream": "stream",
    "torch.Stream": "stream", "torch.Event": "stream", "torch.cuda.cudart": "stream",
    "torch.multiprocessing": "process", "torch.distributed": "network",
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
#: the builtins a candidate may name; every other builtin (exec, eval, getattr, vars, globals, type, open,
#: __import__, super, object, dir, ...) is an escape
ALLOWED_BUILTINS = {
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "filter", "float", "frozenset", "int",
    "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "pow", "print", "range",
    "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip", "complex", "chr",
    "ord", "hex", "bin", "oct", "format", "callable", "hasattr", "property", "staticmethod", "classmethod",
    "True", "False", "None", "Ellipsis", "NotImplemented", "__name__",
    "Exception", "ValueError", "TypeError", "RuntimeError", "AssertionError", "NotImplementedError",
    "KeyError", "IndexError", "ArithmeticError", "ZeroDivisionError", "OverflowError", "StopIteration",
}
BUILTIN_NAMES = frozenset(dir(builtins))
#: builtins by family, so that their rejection names it
BUILTIN_FAMILY = {"open": "filesystem", "id": "output-cache", "hash": "output-cache"}
#: non-underscore attributes that reach frames, code or the class graph (underscore names are all refused)
ESCAPE_ATTRS = {"f_globals", "f_locals", "f_back", "f_builtins", "f_code", "f_trace", "gi_frame", "gi_code",
                "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code", "tb_frame", "tb_next",
                "co_code", "co_consts", "co_names", "mro", "modules", "builtins", "get_type_hints",
                "ForwardRef", "attrgetter", "methodcaller", "gpu_worker", "activities", "workflows", "baselines",
                # they build classes from a namespace given as data, where a hook's name is only a string
                "make_dataclass", "Enum", "IntEnum", "Flag", "IntFlag", "StrEnum", "new_class"}
CACHE_ATTRS = {"data_ptr", "_version", "untyped_storage", "storage", "_cdata", "storage_offset",
               "unsafe_chunk", "_base", "lru_cache", "cache", "cached_property"}
SUBCLASS_ATTRS = {"__torch_function__", "__torch_dispatch__", "as_subclass", "_make_subclass",
                  "_make_wrapper_subclass", "TorchFunctionMode", "TorchDispatchMode"}
THREAD_NAMES = {"Thread": "lazy-output", "Timer": "lazy-output", "Process": "process", "Popen": "process",
                "system": "process", "fork": "process", "spawn": "process", "posix_spawn": "process"}
#: modules that are attributes of torch, triton and the submodules a candidate may use, and that it may not
#: name (tests/gpu_worker/test_rules.py holds the installed torch and Triton to this list)
LIBRARY_MODULES = {
    "torch": ("accelerator", "amp", "ao", "autograd", "backends", "classes", "compiler", "cpp", "cpu",
              "distributed", "distributions", "export", "func", "futures", "fx", "hub", "jit", "library",
              "linalg", "masked", "monitor", "mps", "mtia", "nested", "ops", "optim", "overrides", "package",
              "profiler", "quantization", "quasirandom", "return_types", "serialization", "sparse", "storage",
              "testing", "torch_version", "utils", "windows", "xpu", "onnx", "signal", "types", "multiprocessing"),
    "torch.cuda": ("amp", "gds", "graphs", "green_contexts", "jiterator", "memory", "nccl", "nvtx", "profiler",
                   "sparse", "streams", "tunable", "random", "comm"),
    "torch.nn": ("attention", "common_types", "grad", "init", "intrinsic", "modules", "parallel", "parameter",
                 "qat", "quantizable", "quantized", "utils"),
    "torch.nn.functional": ("grad", "np"),
    "torch.functional": ("np",),
    "triton": ("backends", "compiler", "errors", "knobs", "runtime", "testing", "tools", "profiler",
               "experimental"),
    "triton.language": (),
    "triton.language.semantic": ("ir",),
    "triton.language.standard": ("np",),
    "triton.language.core": ("ir", "knobs"),
    "triton.language.extra": ("hip", "module"),
}
#: module-valued attributes a candidate may use in a chain (torch.cuda.x, tl.extra.libdevice.x, ...)
ALLOWED_MODULES = {"torch", "torch.cuda", "torch.nn", "torch.nn.functional", "torch.fft", "torch.special",
                   "torch.version", "torch.functional", "torch.random", "triton", "triton.language",
                   "triton.language.core",
                   "triton.language.extra", "triton.language.extra.libdevice", "triton.language.extra.cuda",
                   "triton.language.extra.cuda.libdevice",
                   "triton.language.math", "triton.language.standard", "triton.language.target_info",
                   "triton.language.semantic", "triton.language.random"}
LIBRARY_MODULE_PATHS = frozenset(f"{root}.{name}" for root, names in LIBRARY_MODULES.items() for name in names)
PURE_SEGMENTS = {"math", "cmath", "chunk", "select", "random", "copy", "array", "string", "numbers",
                 "statistics", "heapq", "bisect", "operator", "itertools", "collections", "enum", "dataclasses",
                 "abc", "decimal", "fractions", "functools", "typing", "__future__"}
#: dunder methods a candidate's class may define (others are hooks torch or the harness would call)
ALLOWED_DUNDERS = {"__init__", "__post_init__", "__repr__"}
TIMER_NAMES = {"time", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
               "Event", "elapsed_time", "record", "synchronize", "CUDAGraph", "do_bench", "_sleep"}


def _stdlib_names() -> frozenset:
    import sys

    return frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(SYSTEM_MODULES)


STDLIB_SEGMENTS = _stdlib_names() - PURE_SEGMENTS


def segment_rule(name: str) -> tuple[str, str] | None:
    """The rule an attribute name breaks wherever it appears in a chain (torch.X, x.X, f().X)."""
    if name in CACHE_ATTRS:
        return "output-cache", f"attribute {name!r}: pointer/version-keyed state is not allowed"
    if name in SUBCLASS_ATTRS:
        return "lazy-output", f"{name!r} is not allowed (outputs completed outside the call)"
    if name.startswith("_"):
        return "escape", f"attribute {name!r}: names starting with an underscore are not allowed"
    if name in ESCAPE_ATTRS:
        return "escape", f"attribute {name!r} is not allowed"
    if name in THREAD_NAMES:
        return THREAD_NAMES[name], f"{name!r} is not allowed"
    if name in STDLIB_SEGMENTS:
        fam = SYSTEM_MODULES.get(name, "escape")
        return fam, f"attribute {name!r}: reaching the {name!r} module through another module is not allowed"
    return None


def module_path_rule(full: str) -> tuple[str, str] | None:
    """A chain rooted at an imported module (already resolved through aliases) that passes through one of
    the library's modules a candidate may not use."""
    parts = full.split(".")
    for i in range(2, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in LIBRARY_MODULE_PATHS:
            return "escape", f"use of {full!r}: the module {prefix!r} is not open to candidates"
    return None


def _problem_ops(problem: str) -> set[str]:
    if problem.startswith("file:"):  # a problem file: the ops its reference calls (baselines/external/reference_ops.py)
        from baselines.external.reference_ops import reference_ops_for_key

        return set(reference_ops_for_key(problem))
    if problem.startswith("folder:"):  # a problem folder names its core ops itself (Problem.core_ops)
        from baselines.registry import get_problem

        return set(getattr(get_problem(problem), "core_ops", ()))
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
            dotted_rule = _attr_rule(module) or module_path_rule(module)
            if dotted_rule:
                return dotted_rule
            for part in module.split(".")[1:]:  # import torch.utils.x, import triton.runtime
                r = segment_rule(part)
                if r:
                    return r[0], f"import of {module!r}: {r[1]}"
            return None
    return "forbidden-import", f"import of {module!r}: allowed are {', '.join(ALLOWED_IMPORTS)}"


def _attr_rule(dotted: str) -> tuple[str, str] | None:
    for prefix, rule in FORBIDDEN_ATTRS.items():
        if dotted == prefix or dotted.startswith(prefix + "."):
            return rule, f"use of {dotted!r} is not allowed ({rule})"
    return None


def _bound_names(nodes: list) -> set[str]:
    """Every name the module binds anywhere (assignments, arguments, definitions, imports, loop and
    comprehension targets, with-as, match captures): a loaded name outside this set is a builtin."""
    out = set()
    for n in nodes:
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                out.add(a.asname or a.name.split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)
    return out


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _imports(nodes: list) -> tuple[dict[str, str], set[str]]:
    """Every import's local name -> the dotted name it binds, and which of those dotted names are modules."""
    aliases: dict[str, str] = {}
    modules: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            for a in n.names:
                local = a.asname or a.name.split(".")[0]
                aliases[local] = a.name if a.asname else local
                modules.add(aliases[local])
        elif isinstance(n, ast.ImportFrom) and not n.level:
            for a in n.names:
                full = f"{n.module or ''}.{a.name}"
                aliases[a.asname or a.name] = full
                if full in ALLOWED_MODULES or full in LIBRARY_MODULE_PATHS or a.name in STDLIB_SEGMENTS | PURE_SEGMENTS:
                    modules.add(full)
    return aliases, modules


def _torch_compute_rule(full: str, called: bool) -> tuple[str, str] | None:
    """A chain under torch that computes: a compute function or method named (torch.exp, torch.Tensor.sum),
    or a call of any torch function outside ALLOWED_TORCH_CALLS or into a module whose functions compute."""
    if not full.startswith("torch."):
        return None
    parent, _, name = full.rpartition(".")
    why = f"{full!r} computes in torch; torch may only allocate, view, copy, cast and fill (the work is your Triton)"
    if name in COMPUTE_NAMES:
        return "library-kernel", why
    if called and parent == "torch" and name[:1].islower() and name not in ALLOWED_TORCH_CALLS:
        return "library-kernel", why
    if called and any(parent == m and name not in ok for m, ok in COMPUTE_MODULES.items()):
        return "library-kernel", why
    return None


def _is_kernel_decorator(paths: set[str]) -> bool:
    return any(p.startswith("triton.") and p.rsplit(".", 1)[-1] in ("jit", "autotune", "heuristics") for p in paths)


class _Checker(ast.NodeVisitor):
    def __init__(self, problem: str, nodes: list):
        self.ops = _problem_ops(problem)
        self.bound = _bound_names(nodes)
        self.aliases, modules = _imports(nodes)  # local name -> dotted module/object it stands for
        self.import_roots = {v.split(".")[0] for v in self.aliases.values()}
        self.names = ModuleNames(nodes, self.aliases, modules | ALLOWED_MODULES | LIBRARY_MODULE_PATHS)
        # module objects held in a variable, passed or returned: refused once the walk found nothing more
        # specific (a stream API reached through the variable is named `stream`)
        self.held: list[tuple[ast.AST, str]] = []
        self.in_kernel = 0  # inside a @triton.jit function: its methods are Triton's (x.sum(axis=0))

    def fail(self, rule: str, node: ast.AST, what: str):
        line = getattr(node, "lineno", "?")
        raise _Violation(rule, f"line {line}: {what}")

    def finish(self):
        if self.held:
            node, module = self.held[0]
            self.fail("escape", node, f"module {module!r} held in a variable, passed or returned: it may only be "
                                      f"used as {module}.name")

    # imports ---------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import):
        for a in node.names:
            r = _import_rule(a.name)
            if r:
                self.fail(r[0], node, r[1])

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
            r = _attr_rule(full) or self._name_rule(a.name, node, full) or segment_rule(a.name) \
                or module_path_rule(full) or _torch_compute_rule(full, called=False)
            if r:
                self.fail(r[0], node, r[1])

    def _name_rule(self, name: str, node, full: str):
        if name in MATMUL_NAMES and full.startswith("torch"):
            return "library-kernel", f"{full!r}: cuBLAS-backed matmul may not do the operator's core"
        if name in self.ops and full.startswith("torch"):
            return "library-kernel", f"{full!r} is the library's implementation of this operator"
        return None

    # names and attributes --------------------------------------------------------------------
    def _check_held(self, node: ast.AST):
        if isinstance(getattr(node, "ctx", None), ast.Store):
            return
        parent = getattr(node, "parent", None)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # module.name: the chain is checked as a whole
        held = self.names.modules(node)
        if held:
            self.held.append((node, sorted(held)[0]))

    def _called(self, node: ast.AST) -> bool:
        parent = getattr(node, "parent", None)
        return isinstance(parent, ast.Call) and parent.func is node

    def visit_Attribute(self, node: ast.Attribute):
        # every attribute name is checked wherever it appears: a chain from any object (a module, a
        # function's result, a subscript) may lead to the same places as one from an import alias
        r = segment_rule(node.attr)
        if r:
            self.fail(r[0], node, r[1])
        paths = self.names.paths(node)
        called = self._called(node)
        for full in sorted(paths):
            r = _attr_rule(full) or (module_path_rule(full) if full.split(".")[0] in ("torch", "triton") else None) \
                or _torch_compute_rule(full, called)
            if r:
                self.fail(r[0], node, r[1])
        lang = any(p.startswith("triton.language") or p.split(".")[0] == "tl" for p in paths)
        if node.attr in MATMUL_NAMES and not lang:
            self.fail("library-kernel", node, f".{node.attr}: cuBLAS-backed matmul may not do the operator's core")
        if node.attr in self.ops and not lang:
            self.fail("library-kernel", node, f".{node.attr} is the library's implementation of this operator")
        if called and not self.in_kernel and node.attr in COMPUTE_NAMES - PYTHON_METHODS and not any(
                p.split(".")[0] in self.import_roots for p in self.names.paths(node.value)):
            self.fail("library-kernel", node, f".{node.attr}() computes in torch; torch may only allocate, view, "
                                              "copy, cast and fill (the work is your Triton)")
        self._check_held(node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if node.id.startswith("_") and node.id != "__name__" and node.id not in self.bound or _dunder(node.id) \
                and node.id != "__name__":
            self.fail("escape", node, f"{node.id!r} is not allowed")
        if isinstance(node.ctx, ast.Load) and node.id not in self.bound and node.id not in self.aliases:
            if node.id in BUILTIN_NAMES and node.id not in ALLOWED_BUILTINS:
                fam = BUILTIN_FAMILY.get(node.id, "escape")
                self.fail(fam, node, f"builtin {node.id!r} is not allowed (see rules.ALLOWED_BUILTINS)")
        self._check_held(node)
        if node.id in self.aliases:
            for full in sorted(self.names.paths(node)):
                r = _attr_rule(full) or _torch_compute_rule(full, self._called(node))
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
            roots = {p.split(".")[0] for p in self.names.paths(base)}
            if roots & {"torch", "triton", "math", "functools", "itertools", "operator", "typing", "dataclasses",
                        "collections", "enum"}:
                names = {n.attr for n in ast.walk(t) if isinstance(n, ast.Attribute)}
                fam = "timer" if names & TIMER_NAMES else "escape"
                self.fail(fam, t, f"assignment into {ast.unparse(t)!r}: library objects may not be modified")
        elif isinstance(t, (ast.Tuple, ast.List, ast.Starred)):
            for e in (t.elts if not isinstance(t, ast.Starred) else [t.value]):
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

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self._check_target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete):
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_Try(self, node):
        self.fail("fallback", node, "try/except is not allowed (no fallback paths)")

    visit_TryStar = visit_Try

    def _check_def(self, node, name: str):
        if _dunder(name) and name not in ALLOWED_DUNDERS:
            fam = "lazy-output" if name in SUBCLASS_ATTRS else "escape"
            self.fail(fam, node, f"defining {name!r} is not allowed (a hook torch or the harness would call)")

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self._check_def(node, node.name)
        kernel = any(_is_kernel_decorator(self.names.paths(d.func if isinstance(d, ast.Call) else d))
                     for d in node.decorator_list)
        self.in_kernel += kernel
        self.generic_visit(node)
        self.in_kernel -= kernel

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef):
        for b in node.bases:
            self.fail("lazy-output", node, f"class {node.name} derives from {ast.unparse(b)}; classes with bases are not allowed")
        for k in node.keywords:
            self.fail("escape", node, f"class {node.name}: '{k.arg}=' in a class statement is not allowed")
        for stmt in node.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            for t in targets:
                if isinstance(t, ast.Name):
                    self._check_def(stmt, t.id)
        self.generic_visit(node)

    def visit_Global(self, node):
        self.fail("output-cache", node, "'global' statements are not allowed (state across calls)")

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str):
            for lib in ("fla.", "flash_attn", "flashinfer", "xformers", "vllm", "deep_gemm", "flash_mla",
                        "liger_kernel", "tilelang", "baselines.", "gpu_worker"):
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
        nodes = list(ast.walk(tree))
        for parent in nodes:
            for child in ast.iter_child_nodes(parent):
                child.parent = parent
        checker = _Checker(problem, nodes)
        checker.visit(tree)
        checker.finish()
    except _Violation as v:
        return RuleReport(ok=False, rule=v.rule, detail=v.detail[:2000])
    return RuleReport(ok=True)
