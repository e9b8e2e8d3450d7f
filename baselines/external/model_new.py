"""The second candidate form for problem files: KernelBench's `class ModelNew`, turned into functions and the
entry function `run(inputs, out)` the harness calls (the candidate language has no classes); and the marker
line between a kernel and its calling form in a file `marathon export` writes."""

from __future__ import annotations

import ast

from baselines.external.file import CPU_SHAPE, ExternalProblem
from baselines.parse import parse as parse_source
from baselines.problem import ProblemFileError

#: the line `marathon export` writes between a kernel and the code that calls it in the problem's form;
#: the harness (and `marathon verify`) judges what lies above it
EXPORT_MARKER = "# ---- marathon export: the problem's calling form; the verified kernel is above this line ----"


def kernel_part(source: str) -> str:
    """The candidate of an exported kernel file (the part above EXPORT_MARKER); any other source as it is."""
    head, sep, _ = source.partition(EXPORT_MARKER)
    return head.rstrip("\n") + "\n" if sep else source


def _is_super_init(stmt) -> bool:
    """`super().__init__(...)`, `super(ModelNew, self).__init__(...)` or `nn.Module.__init__(self)`."""
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__")


def _function_name(method: str) -> str:
    return "modelnew_" + method.strip("_")


class _FieldsOfADict(ast.NodeTransformer):
    """A method's body with its instance as a dict of fields: `self.x` is `self["x"]`, `self.m(...)` is
    `modelnew_m(self, ...)`."""

    def __init__(self, self_name: str, methods: set[str]):
        self.self_name, self.methods = self_name, methods

    def _is_self(self, node) -> bool:
        return isinstance(node, ast.Name) and node.id == self.self_name

    def visit_Call(self, node: ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and self._is_self(f.value) and f.attr in self.methods:
            node = ast.Call(func=ast.Name(_function_name(f.attr), ast.Load()),
                            args=[ast.Name(self.self_name, ast.Load())] + node.args, keywords=node.keywords)
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute):
        if self._is_self(node.value):
            return ast.Subscript(value=node.value, slice=ast.Constant(node.attr), ctx=node.ctx)
        return self.generic_visit(node)


def _as_functions(cls: ast.ClassDef, taken: set[str]) -> list[ast.stmt] | None:
    """ModelNew's methods as module functions `modelnew_<name>(self, ...)` of a dict of its fields, its
    `super().__init__()` dropped; None where the class holds anything else (class attributes, decorated
    methods, a method without self) or a function's name is taken: the rules then judge it as written."""
    methods = [s for s in cls.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not methods or not all(isinstance(m, ast.FunctionDef) and not m.decorator_list and m.args.args
                              for m in methods):
        return None
    names = {m.name for m in methods}
    if "forward" not in names or {_function_name(n) for n in names} & taken:
        return None
    out = []
    for m in methods:
        m.body = [s for s in m.body if not _is_super_init(s)] or [ast.Pass()]
        fn = _FieldsOfADict(m.args.args[0].arg, names).visit(m)
        fn.name = _function_name(m.name)
        out.append(fn)
    return out


def entry_source(source: str, problem: ExternalProblem) -> str:
    """A candidate written in KernelBench's form, `class ModelNew(nn.Module)` with Model's constructor and
    forward, as the entry-function form the harness calls, in the candidate language (no classes): each
    method becomes a function `modelnew_<name>(self, ...)` whose `self` is a dict of the instance's fields
    (`self.eps` is `self["eps"]`), and a `run(inputs, out)` is added that builds that dict once per input
    size with modelnew_init and the constructor arguments of that size (get_init_inputs() or
    get_cpu_init_inputs()), puts the case's parameters and buffers in it under Model's names, calls
    modelnew_forward on in0, in1, ... and copies what it returns into out0, out1, ... A source with a
    top-level `run`, without ModelNew, or with a ModelNew of another shape is returned as it is (the rules
    judge it). ProblemFileError where the constructor arguments are not literals."""
    source = kernel_part(source)
    try:
        tree = parse_source(source)
    except SyntaxError:
        return source
    if any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        return source
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    taken = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    functions = _as_functions(cls, taken) if cls is not None else None
    if functions is None:
        return source
    at = tree.body.index(cls)
    tree.body[at:at + 1] = functions
    n = problem._n_inputs
    shapes = [problem.shapes[0]] + ([problem.cpu_shape] if problem.has_cpu else [])
    init_args = {}
    for shape in shapes:
        problem.output_specs(shape, cpu=shape.name == CPU_SHAPE)  # records the shape's input sizes
        args = problem._init_args(shape)
        try:
            literal = ast.literal_eval(repr(args)) == args
        except (ValueError, SyntaxError):
            literal = False
        if not literal:
            raise ProblemFileError(f"{problem.label}: a ModelNew candidate needs constructor arguments that are "
                                   f"literals; {shape.name}'s are {args!r} (write run(inputs, out) instead)")
        sizes = tuple(tuple(s) for s in problem._signatures[shape.name][0])
        init_args.setdefault(sizes, list(args))
    has_init = any(f.name == _function_name("__init__") for f in functions)
    ins = ", ".join(f'inputs["in{i}"]' for i in range(n))
    lines = ["", "", "# the ModelNew form called as run(inputs, out): its methods, functions of a dict of its fields",
             "import torch as marathon_torch", "",
             f"MARATHON_INIT_ARGS = {init_args!r}", "MARATHON_MODELS = {}", "", "",
             "def run(inputs, out):",
             f"    sizes = ({''.join(f'tuple(inputs[{chr(34)}in{i}{chr(34)}].shape), ' for i in range(n))})",
             "    model = MARATHON_MODELS.get(sizes)",
             "    if model is None:",
             "        model = {}"]
    if has_init:
        lines.append(f"        {_function_name('__init__')}(model, *MARATHON_INIT_ARGS[sizes])")
    lines.append("        MARATHON_MODELS[sizes] = model")
    lines += [f'    model["{name}"] = inputs["{name}"]' for name in problem._state_names]
    lines += [f"    result = {_function_name('forward')}(model, {ins})",
              "    results = (result,) if isinstance(result, marathon_torch.Tensor) else tuple(result)"]
    lines += [f'    out["out{i}"].copy_(results[{i}])' for i in range(problem._n_outputs)]
    return ast.unparse(tree) + "\n".join(lines) + "\n"
