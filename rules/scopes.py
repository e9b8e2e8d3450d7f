"""Where a candidate's names resolve. Every name its code loads must be bound by the candidate itself (in
that scope, an enclosing function's or the module's) or be a builtin: any other name would be looked up
in the module's globals at run time, where a library may have put objects of its own (Triton's interpreter
copies its module's globals, numpy and time among them, into the module of a kernel it rewrites). A name
the module deletes at its top level could be found there again afterwards, so that is refused too."""

from __future__ import annotations

import ast

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _arg_names(args: ast.arguments) -> set[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def _bound_in(body: list[ast.AST]) -> set[str]:
    """The names a scope's own statements bind: not inside a nested function, class or comprehension,
    whose bindings are theirs (a definition binds its own name here)."""
    out: set[str] = set()
    todo = list(body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
            todo += n.decorator_list  # evaluated here (a walrus in one binds here)
            continue
        if isinstance(n, (ast.Lambda, *COMPREHENSIONS)):
            continue
        if isinstance(n, ast.AnnAssign) and n.value is None:  # `x: int` alone binds nothing
            todo.append(n.annotation)
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in n.names if a.name != "*"}
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        todo += ast.iter_child_nodes(n)
    return out


def unbound_names(tree: ast.Module, builtins: frozenset[str]) -> list[tuple[ast.AST, str]]:
    """(node, why) for each load of a name no enclosing scope of the candidate binds and no builtin is, and
    each top-level `del` of a name."""
    found: list[tuple[ast.AST, str]] = []
    module = _bound_in(tree.body)

    def visit(node: ast.AST, scopes: tuple[set[str], ...]):
        if isinstance(node, ast.Delete) and not scopes:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    found.append((t, f"'del {t.id}' at the module's top level: the name could be found in the "
                                     "module's globals again, put there by a library"))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if not any(node.id in s for s in scopes) and node.id not in module and node.id not in builtins:
                found.append((node, f"name {node.id!r} is bound nowhere in the candidate: a name is bound by the "
                                    "candidate's own code or is a listed builtin"))
            return
        if isinstance(node, FUNCTIONS):
            a = node.args
            every = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
            outer = getattr(node, "decorator_list", []) + a.defaults + a.kw_defaults + [
                x.annotation for x in every] + [getattr(node, "returns", None)]
            for d in outer:  # evaluated where the function is defined
                if d is not None:
                    visit(d, scopes)
            own = _arg_names(node.args) | (_bound_in(node.body) if not isinstance(node, ast.Lambda) else set())
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                visit(child, scopes + (own,))
            return
        if isinstance(node, COMPREHENSIONS):
            own = {t.id for g in node.generators for t in ast.walk(g.target) if isinstance(t, ast.Name)}
            first = node.generators[0].iter
            visit(first, scopes)  # the first iterable is evaluated in the enclosing scope
            for child in ast.iter_child_nodes(node):
                parts = [child.target, *child.ifs] if child is node.generators[0] else [child]
                for part in parts:
                    visit(part, scopes + (own,))
            return
        for child in ast.iter_child_nodes(node):
            visit(child, scopes)

    for stmt in tree.body:
        visit(stmt, ())
    return found


def bound_names(tree: ast.AST) -> set[str]:
    """Every name the module binds anywhere: a loaded name outside this set is a builtin."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
    return out
