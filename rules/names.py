"""What a candidate's names and expressions may stand for, for the static rules (AST only, no torch).

Imports bind names to modules and objects; every other binding of a module object (an assignment, tuple
unpacking, a default argument, a class or instance attribute, a loop or comprehension variable, a walrus,
a container of modules, a function's return value) is followed too, flow-insensitively, so that a chain
reached through it (`cuda = torch.cuda; cuda.Stream()`) resolves to what it names. Any such binding is
itself refused by the rules (a module object may only be used as `module.name`); following it lets the
rejection name the rule the chain breaks.
"""

from __future__ import annotations

import ast


def _grow(table: dict[str, set[str]], key: str, values: set[str]) -> bool:
    have = table.setdefault(key, set())
    if values <= have:
        return False
    have |= values
    return True


class ModuleNames:
    """`paths(node)`: the dotted names an expression may stand for (`torch.cuda.Stream`, or `x.sum` for a
    name nothing binds to a module); `modules(node)`: the module objects it may evaluate to, a container's
    elements included."""

    def __init__(self, nodes: list, imports: dict[str, str], module_paths: set[str]):
        """`nodes`: every node of the module's tree, each with its `parent` set."""
        self.imports = imports  # local name -> dotted name, from import statements
        self.module_paths = module_paths  # dotted names that are modules
        self.names: dict[str, set[str]] = {}  # a name bound (not by an import) to modules
        self.attrs: dict[str, set[str]] = {}  # an attribute name bound to modules on some object
        self.returns: dict[str, set[str]] = {}  # a function returning or yielding modules, by name
        self.results: dict[ast.AST, list] = {}  # a function -> the values it returns or yields
        for n in nodes:
            if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom)):
                fn = getattr(n, "parent", None)
                while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    fn = getattr(fn, "parent", None)
                if fn is not None:
                    self.results.setdefault(fn, []).append(n.value)
        while self._bind_all(nodes):  # to a fixpoint: a binding may feed another one
            pass

    # what an expression stands for ------------------------------------------------------------
    def paths(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            base = {self.imports.get(node.id, node.id)}
            return base | self.names.get(node.id, set())
        if isinstance(node, ast.Attribute):
            return {f"{p}.{node.attr}" for p in self.paths(node.value)} | self.attrs.get(node.attr, set())
        if isinstance(node, ast.Subscript):
            return self.modules(node.value)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            return set(self.returns.get(name, set())) if name else set()
        return set()

    def modules(self, node: ast.AST | None) -> set[str]:
        if node is None:
            return set()
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
            return {p for p in self.paths(node) if p in self.module_paths}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.modules(e) for e in node.elts))
        if isinstance(node, ast.Dict):
            return set().union(*(self.modules(e) for e in node.keys + node.values if e is not None))
        if isinstance(node, (ast.Starred, ast.NamedExpr, ast.Await)):
            return self.modules(node.value)
        if isinstance(node, ast.IfExp):
            return self.modules(node.body) | self.modules(node.orelse)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.modules(v) for v in node.values))
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.modules(node.elt)
        if isinstance(node, ast.DictComp):
            return self.modules(node.key) | self.modules(node.value)
        return set()

    # bindings -----------------------------------------------------------------------------------
    def _bind_all(self, nodes: list) -> bool:
        grew = False
        for n in nodes:
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    grew |= self._bind(t, n.value)
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and n.value is not None:
                grew |= self._bind(n.target, n.value)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                grew |= self._bind_set(n.target, self.modules(n.iter))
            elif isinstance(n, (ast.With, ast.AsyncWith)):
                for item in n.items:
                    if item.optional_vars is not None:
                        grew |= self._bind(item.optional_vars, item.context_expr)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                grew |= self._bind_defaults(n.args)
                if isinstance(n, ast.Lambda):
                    continue
                out = self.results.get(n, [])
                grew |= _grow(self.returns, n.name, set().union(*(self.modules(v) for v in out)))
            elif isinstance(n, ast.Match):
                held = self.modules(n.subject)
                for case in n.cases:
                    for p in ast.walk(case.pattern):
                        name = getattr(p, "name", None) or getattr(p, "rest", None)
                        if name:
                            grew |= _grow(self.names, name, held)
        return grew

    def _bind_defaults(self, args: ast.arguments) -> bool:
        grew = False
        positional = args.posonlyargs + args.args
        for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            grew |= _grow(self.names, a.arg, self.modules(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults):
            grew |= _grow(self.names, a.arg, self.modules(d))
        return grew

    def _bind(self, target: ast.AST, value: ast.AST) -> bool:
        if isinstance(value, ast.Lambda) and isinstance(target, ast.Name):
            return _grow(self.returns, target.id, self.modules(value.body))
        if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
                and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts)):
            grew = False
            for t, v in zip(target.elts, value.elts):
                grew |= self._bind(t, v)
            return grew
        return self._bind_set(target, self.modules(value))

    def _bind_set(self, target: ast.AST, held: set[str]) -> bool:
        if not held:
            return False
        if isinstance(target, ast.Name):  # also as an attribute: a name bound in a class body is K.name
            return _grow(self.names, target.id, held) | _grow(self.attrs, target.id, held)
        if isinstance(target, ast.Attribute):
            return _grow(self.attrs, target.attr, held)
        if isinstance(target, ast.Subscript):  # d[k] = module: the container holds it
            return self._bind_set(target.value, held)
        if isinstance(target, ast.Starred):
            return self._bind_set(target.value, held)
        if isinstance(target, (ast.Tuple, ast.List)):
            grew = False
            for e in target.elts:
                grew |= self._bind_set(e, held)
            return grew
        return False
