"""Static rules for candidate sources (AST only: no torch import, no execution).

A candidate is a module in a small language (rules/host_language.py for its Python, rules/triton_language.py
for its @triton.jit functions): the rules accept a construct only where the language lists it, and refuse
everything else with one line naming the construct and the rule. `check_source(source, problem)` returns a
RuleReport with the source's first refusal that names a family (else its first), or ok. The same rule
names appear in run-time rejections from the sandbox guard (gpu_worker.guard), so a proposer sees one
vocabulary; where a rule is a cheating family (`FAMILIES` in workflows/contracts/base.py) it carries its name:

  syntax            the source does not parse
  contract          no top-level `def run(inputs, out)`
  language          a construct or name the language does not list (a class, a lambda, a generator, `with`,
                    `del`, a decorator but Triton's, a builtin or attribute outside the lists, ...)
  forbidden-import  an import of anything but torch, triton, triton.language and math
  library-kernel    torch that computes rather than allocates, views, copies, casts or fills (torch.exp,
                    x.sum(), torch.nn.functional, torch.ops, torch.compile, matmuls and `@`), and the problem's
                    own PyTorch op (rules/torch_ops.py)
  escape            what reaches introspection: attributes named by strings (getattr, setattr, vars, hasattr,
                    str.format), any name starting with an underscore after a dot, dunders, frames, code and
                    generators' or tracebacks' fields, descriptors, a module used as a value, assignments into
                    attributes, torch's and Triton's closed modules (torch.utils, triton.runtime, ...), a
                    name the candidate binds nowhere (rules/scopes.py)
  network / process / filesystem / timer / stream / output-cache / lazy-output
                    what a name of that family would do (sockets, subprocesses, open, timers, streams and
                    events, data_ptr and id, threads and Tensor subclasses), and `global` (output-cache)
  fallback          try/except (a kernel that falls back to a library when it fails)
"""

from __future__ import annotations

import ast
import builtins

from baselines.parse import parse as parse_source
from rules import host_language as host
from rules import scopes
from rules import triton_language as tri
from rules.refusals import CONSTRUCTS, NAME_FAMILY, import_rule, name_rule
from rules.torch_ops import problem_ops
from workflows.contracts import RuleReport

#: strings that name a kernel library or the harness
LIBRARY_STRINGS = ("fla.", "flash_attn", "flashinfer", "xformers", "vllm", "deep_gemm", "flash_mla", "liger_kernel",
                   "tilelang", "baselines.", "gpu_worker")
BUILTIN_NAMES = frozenset(dir(builtins))
ALL_BUILTINS = host.BUILTINS | host.ERRORS | tri.KERNEL_BUILTINS
HOST_TREE = host.MODULE_MEMBERS
KERNEL_TREE = tri.KERNEL_MODULE_MEMBERS

HOST_EXPRESSIONS = tri.EXPRESSIONS + host.EXTRA_EXPRESSIONS
TIMING_NAMES = {n for n, fam in NAME_FAMILY.items() if fam in ("timer", "stream")}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


def _describe(node: ast.AST) -> str:
    return type(node).__name__


class _Walker:
    """One pass over the module, collecting every refusal (rule, line, words)."""

    def __init__(self, problem: str, tree: ast.Module):
        self.ops = problem_ops(problem)
        self.bound = scopes.bound_names(tree)
        self.aliases: dict[str, str] = {}  # a local name -> the dotted module or member an import bound it to
        self.imported: dict[str, set[str]] = {}  # a local name -> every path an import anywhere binds it to
        self.found: list[tuple[bool, int, bool, int, str, str]] = []
        self.in_class = 0  # inside a (refused) class body: only its torch hooks are named besides
        for n in ast.walk(tree):
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                self._bind_import(n)
        # the @triton.jit functions: their bodies are kernel code, and host code only launches them
        self.kernel_defs = {n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and any(
            self.path(d.func if isinstance(d, ast.Call) else d) == "triton.jit" for d in n.decorator_list)}
        self.kernels = {n.name for n in self.kernel_defs}
        self.callees: set[int] = set()  # the nodes called where they stand (a call's function, a decorator)
        # host functions of the module, bound by their def alone: '**' may pass keywords into them
        rebound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
            for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a is not None} | set(self.aliases)
        defs = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.host_defs = {d for d in defs if d not in self.kernels and d not in rebound and defs.count(d) == 1}

    def refuse(self, node: ast.AST, rule: str, what: str, weak: bool = False):
        """Reported first: a refusal with a family, by line (on one line, before an escape); `weak` ones and
        `language` ones only where there is nothing else (a module bound to a name is refused, and the
        stream API reached through that name names the rejection)."""
        line = getattr(node, "lineno", 0)
        self.found.append((weak or rule == "language", line, rule == "escape", len(self.found), rule,
                           f"line {line}: {what}"))

    # imports ---------------------------------------------------------------------------------------------
    def _bind_import(self, node):
        if isinstance(node, ast.Import):
            for a in node.names:
                if self._module(a.name):
                    self._alias(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
        elif not node.level and self._module(node.module or ""):
            for a in node.names:
                if self._member(node.module, a.name):
                    self._alias(a.asname or a.name, f"{node.module}.{a.name}")

    def _alias(self, name: str, path: str):
        # one name, one path: `aliases` is read for every scope, so a name two imports bind to different
        # modules (one in a function, one in the module) would be read as one where the other is bound
        self.aliases[name] = path
        self.imported.setdefault(name, set()).add(path)

    def _one_path(self, node, name: str):
        paths = self.imported.get(name, set())
        if len(paths) > 1:
            self.refuse(node, "escape", f"imports bind {name!r} to {', '.join(sorted(paths))}: a name an import "
                                        "binds names one module or member throughout the source")

    @staticmethod
    def _module(path: str) -> bool:
        return path in HOST_TREE or path in KERNEL_TREE

    @staticmethod
    def _member(module: str, name: str) -> bool:
        return name in HOST_TREE.get(module, ()) or name in KERNEL_TREE.get(module, ())

    def import_(self, node):
        if isinstance(node, ast.Import):
            for a in node.names:
                if not self._module(a.name):
                    rule, why = import_rule(a.name)
                    self.refuse(node, rule, f"import of {a.name!r} is {why}")
                self._store(node, a.asname or a.name.split(".")[0], importing=True)
                self._one_path(node, a.asname or a.name.split(".")[0])
            return
        mod = node.module or ""
        if node.level:
            self.refuse(node, "forbidden-import", "relative imports are not allowed")
        elif mod == "__future__":
            if [a.name for a in node.names] != ["annotations"]:
                self.refuse(node, "language", "from __future__ only 'annotations' may be imported")
        elif not self._module(mod):
            rule, why = import_rule(mod)
            self.refuse(node, rule, f"import from {mod!r} is {why}")
        else:
            for a in node.names:
                if a.name == "*":
                    self.refuse(node, "escape", f"'from {mod} import *' is not allowed")
                elif not self._member(mod, a.name):
                    rule, why = name_rule(a.name, under_torch=mod.startswith("torch"))
                    self.refuse(node, rule, f"'from {mod} import {a.name}': {why}")
                else:
                    self._store(node, a.asname or a.name, importing=True)
                    self._one_path(node, a.asname or a.name)

    # statements ------------------------------------------------------------------------------------------
    def body(self, stmts: list, kernel: bool):
        for s in stmts:
            self.stmt(s, kernel)

    def stmt(self, node: ast.stmt, kernel: bool):
        allowed = tri.STATEMENTS if kernel else host.STATEMENTS
        if not isinstance(node, allowed):
            rule, what = CONSTRUCTS.get(type(node), ("language", f"a {_describe(node)} statement is outside the "
                                                                 "language"))
            if kernel and type(node) not in CONSTRUCTS:
                what = f"a {_describe(node)} statement inside a @triton.jit function is outside Triton's language"
            self.refuse(node, rule, what)
            if isinstance(node, ast.ClassDef):
                self._class(node)
            self.in_class += isinstance(node, ast.ClassDef)
            self._children(node, kernel)
            self.in_class -= isinstance(node, ast.ClassDef)
            return
        if isinstance(node, ast.FunctionDef):
            self.function(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            self.import_(node)
        elif isinstance(node, (ast.Assign, ast.Delete)):
            for t in node.targets:
                self.target(t, kernel)
            if isinstance(node, ast.Assign):
                self.expr(node.value, kernel)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                self.refuse(node, "library-kernel", "'@=' is a cuBLAS matmul; use tl.dot inside a kernel")
            self.target(node.target, kernel)
            if isinstance(node, ast.AnnAssign):
                self.expr(node.annotation, kernel)
            if node.value is not None:
                self.expr(node.value, kernel)
        elif isinstance(node, ast.For):
            self.target(node.target, kernel)
            self.expr(node.iter, kernel)
            self.body(node.body + node.orelse, kernel)
        elif isinstance(node, ast.Raise):
            self.raise_(node)
        else:  # Return, If, While, Expr, Assert, Pass, Break, Continue
            self._children(node, kernel)

    def _children(self, node: ast.AST, kernel: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.stmt(child, kernel)
            elif isinstance(child, ast.expr):
                self.expr(child, kernel)
            elif isinstance(child, (ast.excepthandler, ast.withitem, ast.arguments, ast.keyword,
                                    ast.comprehension, ast.match_case)):
                self._children(child, kernel)

    def _class(self, node: ast.ClassDef):
        for b in node.bases:
            if "Tensor" in ast.unparse(b):
                self.refuse(node, "lazy-output", f"class {node.name} derives from {ast.unparse(b)} (outputs "
                                                 "completed outside the call)")
        for k in node.keywords:
            self.refuse(node, "escape", f"class {node.name}: '{k.arg}=' in a class statement is not allowed")

    def raise_(self, node: ast.Raise):
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if node.cause is not None or not (isinstance(exc, ast.Name) and exc.id in host.ERRORS):
            self.refuse(node, "language", f"raise only a builtin error ({', '.join(sorted(host.ERRORS))}), "
                                          "without 'from'")
        if isinstance(node.exc, ast.Call):
            for a in node.exc.args + [k.value for k in node.exc.keywords]:
                self.expr(a, False)

    def function(self, node: ast.FunctionDef):
        self._store(node, node.name)
        for d in node.decorator_list:
            path = self.path(d.func if isinstance(d, ast.Call) else d)
            if path not in host.DECORATORS:
                rule, why = name_rule(path.rsplit(".", 1)[-1]) if path else ("language", "")
                rule = "escape" if rule == "language" and path in ("property", "staticmethod", "classmethod") else rule
                self.refuse(d, rule, f"decorator {ast.unparse(d)!r}: only Triton's (triton.jit, triton.autotune, "
                                     "triton.heuristics) are allowed")
            if not isinstance(d, ast.Call):  # a decorator is called on the function
                self.callees.add(id(d))
            self.expr(d, False)
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                self._store(a, a.arg)
                if a.annotation is not None:
                    self.expr(a.annotation, False)
        for d in args.defaults + [d for d in args.kw_defaults if d is not None]:
            self.expr(d, False)
        if node.returns is not None:
            self.expr(node.returns, False)
        self.body(node.body, node in self.kernel_defs)

    def target(self, node: ast.AST, kernel: bool):
        if isinstance(node, ast.Name):
            self._store(node, node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self.target(e, kernel)
        elif isinstance(node, ast.Starred):
            self.target(node.value, kernel)
        elif isinstance(node, ast.Subscript):
            self.expr(node.value, kernel)
            self.expr(node.slice, kernel)
        elif isinstance(node, ast.Attribute):
            names = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            timing = bool(names & TIMING_NAMES)
            self.refuse(node, "timer" if timing else "escape",
                        f"assignment into {ast.unparse(node)!r}: attributes are read-only in the language",
                        weak=not timing)
            self.expr(node.value, kernel)
        else:
            self.refuse(node, "language", f"assignment to a {_describe(node)} is outside the language")

    def _store(self, node: ast.AST, name: str, importing: bool = False):
        hook = name in ("__torch_function__", "__torch_dispatch__")
        if _dunder(name) and (hook or not self.in_class):
            rule = "lazy-output" if hook else "escape"
            self.refuse(node, rule, f"binding {name!r} is not allowed (a hook Python, torch or the harness would call)")
        elif name in self.aliases and not importing:
            self.refuse(node, "escape", f"rebinding {name!r}, a name an import bound, is not allowed")
        elif name in BUILTIN_NAMES and name not in ALL_BUILTINS:
            # a refused builtin stays refused wherever it is named: `def f(getattr=getattr)` binds nothing, and
            # a parameter named `iter` in one function does not make `iter` the candidate's in another
            self.refuse(node, "escape", f"binding {name!r}, the name of a builtin outside the language, is not "
                                        "allowed (name it otherwise)")

    # expressions -----------------------------------------------------------------------------------------
    def expr(self, node: ast.expr, kernel: bool):
        allowed = tri.EXPRESSIONS if kernel else HOST_EXPRESSIONS
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) \
                and id(node) not in self.callees:
            path = self.path(node)
            if path in host.CALLED_WHERE_NAMED:
                self.refuse(node, "escape", f"{path} used as a value: call it where it is named, so that the rules "
                                            "read its arguments")
        if not isinstance(node, allowed):
            rule, what = CONSTRUCTS.get(type(node), ("language", f"a {_describe(node)} is outside the language"))
            if kernel and type(node) not in CONSTRUCTS:
                what = f"a {_describe(node)} inside a @triton.jit function is outside Triton's language"
            self.refuse(node, rule, what)
            self._children(node, kernel)
        elif isinstance(node, ast.Name):
            self.name(node, kernel)
        elif isinstance(node, ast.Attribute):
            self.attribute(node, kernel)
        elif isinstance(node, ast.Call):
            self.call(node, kernel)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                for lib in LIBRARY_STRINGS:
                    if lib in node.value:
                        self.refuse(node, "forbidden-import", f"string mentions {lib!r}")
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            for g in node.generators:
                if g.is_async:
                    self.refuse(node, "language", "'async for': coroutines are outside the language")
                self.target(g.target, kernel)
                self.expr(g.iter, kernel)
                for c in g.ifs:
                    self.expr(c, kernel)
            for e in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
                self.expr(e, kernel)
        else:
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                self.refuse(node, "library-kernel", "'@' on tensors is a cuBLAS matmul; use tl.dot inside a kernel")
            self._children(node, kernel)

    def name(self, node: ast.Name, kernel: bool):
        nid = node.id
        if isinstance(node.ctx, ast.Store):
            self._store(node, nid)
        elif _dunder(nid):
            self.refuse(node, "escape", f"{nid!r} is not allowed")
        elif nid in self.aliases:
            self._path_value(node, self.aliases[nid], kernel)
        elif nid not in self.bound and nid in BUILTIN_NAMES:
            allowed = tri.KERNEL_BUILTINS if kernel else host.BUILTINS | host.ERRORS
            if nid not in allowed:
                rule, why = name_rule(nid)
                where = " inside a @triton.jit function" if kernel and nid in host.BUILTINS else ""
                self.refuse(node, rule, f"builtin {nid!r}{where}: {why}")

    def _path_value(self, node: ast.AST, path: str, kernel: bool):
        """A dotted path used as a value: a module never is one; a member must be listed for its context."""
        tree = KERNEL_TREE if kernel else HOST_TREE
        module, _, name = path.rpartition(".")
        if path in HOST_TREE or path in KERNEL_TREE:
            self.refuse(node, "escape", f"module {path!r} used as a value: it may only be used as {path}.name",
                        weak=True)
        elif name not in tree.get(module, ()):
            self._refuse_member(node, module, name, kernel)

    def _refuse_member(self, node: ast.AST, module: str, name: str, kernel: bool):
        tree = KERNEL_TREE if kernel else HOST_TREE
        rule, why = name_rule(name, under_torch=module.split(".")[0] == "torch" and module in tree)
        if kernel and module not in tree:
            rule, why = ("language", f"{module.split('.')[0]} is host code, not Triton's language") \
                if rule == "language" else (rule, why)
        elif not kernel and module in KERNEL_TREE and name in KERNEL_TREE[module] and rule == "language":
            why = "it is Triton's, for @triton.jit functions only"
        self.refuse(node, rule, f"{module}.{name}: {why}")

    def path(self, node: ast.AST) -> str | None:
        """The dotted name an import-rooted chain stands for (`torch.cuda.get_device_properties`), else None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id) or (node.id if node.id not in self.bound else None)
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def attribute(self, node: ast.Attribute, kernel: bool):
        attrs, base = [], node
        while isinstance(base, ast.Attribute):
            attrs.append(base.attr)
            base = base.value
        attrs.reverse()
        tree = KERNEL_TREE if kernel else HOST_TREE
        if isinstance(base, ast.Name) and base.id in self.aliases:
            path = self.aliases[base.id]
            if path not in HOST_TREE and path not in KERNEL_TREE:  # a member imported by name
                self._path_value(base, path, kernel)
            while attrs and path in tree:
                if attrs[0] not in tree[path]:
                    self._refuse_member(node, path, attrs[0], kernel)
                    attrs = attrs[1:]
                    break
                path, attrs = f"{path}.{attrs[0]}", attrs[1:]
            else:
                if not attrs:  # the whole chain is a module, or a member of one
                    self._path_value(node, path, kernel)
                elif path in HOST_TREE or path in KERNEL_TREE:  # a module of the other context
                    self._refuse_member(node, path, attrs[0], kernel)
                    attrs = attrs[1:]
        else:
            self.expr(base, kernel)
        allowed = tri.KERNEL_VALUE_ATTRS if kernel else host.VALUE_ATTRS
        for a in attrs:
            if a not in allowed or a.startswith("_"):
                rule, why = name_rule(a)
                self.refuse(node, rule, f"attribute {a!r}: {why}")
            elif a in self.ops and not kernel:
                self.refuse(node, "library-kernel", f".{a} is the library's implementation of this operator")

    def call(self, node: ast.Call, kernel: bool):
        if not kernel and isinstance(node.func, ast.Name) and node.func.id in self.kernels:
            # on a GPU such a call raises; the interpreter runs the kernel as host Python and returns its value
            self.refuse(node, "language", f"{node.func.id}(...) calls a @triton.jit function from host code: launch "
                                          f"it with a grid ({node.func.id}[grid](...)) or call it from a kernel")
        self.callees.add(id(node.func))
        self.expr(node.func, kernel)
        path = self.path(node.func)
        if not kernel and path not in host.TRITON_KEYWORDS:
            self._host_keywords(node)
        for a in node.args:
            self.expr(a, kernel)
        for k in node.keywords:
            self.expr(k.value, kernel)
        if kernel and path == "triton.language.inline_asm_elementwise":
            self._inline_asm(node)
        if path in ("triton.Config", "triton.heuristics"):
            field = "kwargs" if path == "triton.Config" else "values"
            self._launch_keys(node, path, node.args[0] if node.args else
                              next((k.value for k in node.keywords if k.arg == field), None))
        if path in host.TRITON_KEYWORDS:
            allowed = host.TRITON_KEYWORDS[path]
            for k in node.keywords:
                if k.arg is None or k.arg not in allowed:
                    rule = name_rule(k.arg or "")[0] if k.arg else "escape"
                    self.refuse(node, rule if rule != "language" else "escape",
                                f"{path}({k.arg or '**'}=...): {path} takes only {', '.join(sorted(allowed))}")
            if len(node.args) > host.TRITON_POSITIONAL[path] or any(isinstance(a, ast.Starred) for a in node.args):
                self.refuse(node, "escape", f"{path}: at most {host.TRITON_POSITIONAL[path]} positional arguments, "
                                            "none starred (the rest are hooks)")


    def _launch_keys(self, node: ast.Call, path: str, d: ast.expr | None):
        """A Config's kwargs and a heuristic's values become a launch's keywords: a dict written out, its
        keys string literals, none of them one of Triton's compile options (the launch refuses those too,
        however they come: gpu_worker/child/launch_options.py)."""
        if d is None:
            return
        if not isinstance(d, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                  for k in d.keys):
            self.refuse(node, "escape", f"{path}: its dict is written out with string keys, so that the rules "
                                        "read the launch keywords it makes")
            return
        refused = sorted({k.value for k in d.keys} & host.REFUSED_OPTIONS)
        if refused:
            self.refuse(node, "escape", f"{path}: key {', '.join(refused)} is one of Triton's compile options, "
                                        "outside the language")

    def _host_keywords(self, node: ast.Call):
        """A host call's keywords are spelled out, and none is one of Triton's options beyond a launch's: any
        call may be a launch (`k[grid]` bound to a name). `**` only into a function of the module, whose
        own calls are checked the same way."""
        for k in node.keywords:
            if k.arg is None and not (isinstance(node.func, ast.Name) and node.func.id in self.host_defs):
                self.refuse(node, "escape", f"'**' in a call of {ast.unparse(node.func)[:40]}: spell the keywords "
                                            "out (a launch's options among them), or pass them to a function of "
                                            "this module")
            elif k.arg in host.REFUSED_OPTIONS:
                self.refuse(node, "escape", f"keyword {k.arg}=: Triton's {k.arg} option is outside the language "
                                            f"(a launch takes its kernel's parameters, {host.LAUNCH_OPTIONS_TEXT})")

    def _inline_asm(self, node: ast.Call):
        asm = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "asm"), None)
        if not (isinstance(asm, ast.Constant) and isinstance(asm.value, str)):
            self.refuse(node, "language", "tl.inline_asm_elementwise: its assembly must be a string literal, "
                                          "so that the rules can read it")
            return
        why = tri.asm_refusal(asm.value)
        if why:
            self.refuse(node, *why)


def check_source(source: str, problem: str) -> RuleReport:
    try:
        tree = parse_source(source)
    except SyntaxError as e:
        return RuleReport(ok=False, rule="syntax", detail=f"line {e.lineno}: {e.msg}")
    run = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    if not run:
        model_new = any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
        return RuleReport(ok=False, rule="contract", detail="no top-level 'def run(inputs, out)'" + (
            "; a ModelNew becomes functions only with plain methods taking self, and no class attributes "
            "(or write run(inputs, out))" if model_new else ""))
    if len(run[0].args.args) != 2:
        return RuleReport(ok=False, rule="contract", detail="run must take exactly (inputs, out)")
    walker = _Walker(problem, tree)
    walker.body(tree.body, kernel=False)
    for node, why in scopes.unbound_names(tree, BUILTIN_NAMES):
        walker.refuse(node, "escape", why, weak=True)
    if walker.found:
        *_, rule, detail = min(walker.found)
        return RuleReport(ok=False, rule=rule, detail=detail[:2000])
    return RuleReport(ok=True)
