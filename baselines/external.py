"""A problem built from one KernelBench-format Python file: any PyTorch reference becomes a problem.

The file (docs/problems.md, "Your own operator") defines

  class Model(nn.Module)      the reference: __init__(*get_init_inputs()), forward(*get_inputs())
  get_inputs()                the inputs at the timed (GPU) size, a list of tensors
  get_init_inputs()           optional: Model's constructor arguments (default: none)
  get_cpu_inputs()            optional: small inputs for the Triton interpreter; without it a CPU run is refused
  get_cpu_init_inputs()       optional: Model's constructor arguments for get_cpu_inputs() (default:
                              get_init_inputs())
  FLOPS, BYTES_MOVED          optional numbers for get_inputs()'s size: the physical floor; without both the
                              floor check is skipped
  TOLERANCE_FLOOR, TOLERANCE_ALPHA   optional: the pass rule's floor and factor (default 1e-5 and 2.0)
  REFRESH = False             optional: time the drawn input sets as they are, without fresh noise per repetition
                              (for inputs that noise makes invalid, e.g. a matrix that must stay symmetric)

What the project derives from it:

- inputs: `in0, in1, ...` from get_inputs()'s positions, drawn with torch's global generator seeded by the
  case's seed; Model is built under the same seed, its float parameters and buffers then scaled and shifted
  per case (baselines.perturb.vary_parameter: LayerNorm's weight 1 and bias 0 become other values), and they
  are inputs too, under their names in the module (`weight`, `fc.bias`, ...). Distribution `plain` is that;
  `scaled` multiplies the float inputs from get_inputs() by SCALE (only where there is a float input).
- timing: each timed repetition's float tensors (parameters and buffers too; integer inputs stay) are a pool
  set's times fresh relative noise (Problem.perturbed), so no repetition meets contents seen before;
  REFRESH = False turns it off.
- outputs: `out0, out1, ...`: forward's tensor, or the tensors of the tuple it returns.
- oracle: Model's forward with inputs and parameters cast to float64; where an op has no float64 kernel,
  float32 (`oracle_dtype` says which, and the description names it).
- baselines: `eager` (primary): forward at the inputs' own dtype; `torch.compile` of the same call where CUDA
  is available (reported by the scoreboard; it is never the run's primary).

The file's bytes live in the artifact store; the problem's name is `file:<sha256 of the bytes>`, so a run
names its problem by content and keeps working when the user edits or deletes the file.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable

from baselines.perturb import vary_parameter
from baselines.problem import OutputSpec, Problem, Shape, UnknownProblem

FILE_PREFIX = "file:"
KEY_RE = re.compile(r"^file:[0-9a-f]{64}$")
#: the factor of the `scaled` distribution on float inputs: a kernel tuned to one input's magnitude fails
SCALE = 8.0
GPU_SHAPE = "get_inputs"
CPU_SHAPE = "get_cpu_inputs"
#: mixed into a case's seed for the generator that varies the Model's parameters
PARAM_SEED = 0x5EED_9A7A


class ProblemFileError(UnknownProblem):
    """A problem file that cannot become a problem: one line that says why."""


def is_file_key(name: str) -> bool:
    return bool(KEY_RE.match(name or ""))


def file_key(data: bytes) -> str:
    return FILE_PREFIX + hashlib.sha256(data).hexdigest()


def _positive_number(mod, name: str, label: str) -> float | None:
    v = getattr(mod, name, None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ProblemFileError(f"{label}: {name} must be a positive number, got {v!r}")
    return float(v)


def load_module(data: bytes, label: str, key: str) -> types.ModuleType:
    """The file executed as a module, its required names checked. Raises ProblemFileError."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise ProblemFileError(f"{label}: not a UTF-8 Python file") from None
    try:
        code = compile(text, label, "exec")
    except SyntaxError as e:
        raise ProblemFileError(f"{label}: syntax error at line {e.lineno}: {e.msg}") from None
    name = "marathon_problem_" + key.removeprefix(FILE_PREFIX)[:16]
    mod = types.ModuleType(name)
    mod.__file__ = label
    sys.modules[name] = mod  # classes defined there name their module (pickling, torch.compile)
    try:
        exec(code, mod.__dict__)
    except Exception as e:  # noqa: BLE001 - whatever the file raises is the file's fault, said in one line
        sys.modules.pop(name, None)
        raise ProblemFileError(f"{label}: running the file raised {type(e).__name__}: {e}") from None
    import torch

    model = getattr(mod, "Model", None)
    if not (isinstance(model, type) and issubclass(model, torch.nn.Module)):
        raise ProblemFileError(f"{label}: defines no class Model(nn.Module)")
    if not callable(getattr(mod, "get_inputs", None)):
        raise ProblemFileError(f"{label}: defines no get_inputs()")
    for opt in ("get_init_inputs", "get_cpu_inputs", "get_cpu_init_inputs"):
        if getattr(mod, opt, None) is not None and not callable(getattr(mod, opt)):
            raise ProblemFileError(f"{label}: {opt} must be a function")
    for n in ("FLOPS", "BYTES_MOVED", "TOLERANCE_FLOOR", "TOLERANCE_ALPHA"):
        _positive_number(mod, n, label)
    return mod


class ExternalProblem(Problem):
    """The Problem interface over a KernelBench-format module (see the module's docstring)."""

    def __init__(self, key: str, data: bytes, label: str | None = None):
        self.name = key
        self.label = label or f"{key[:17]}"
        self.data = data
        self.mod = load_module(data, self.label, key)
        m = self.mod
        self.has_cpu = callable(getattr(m, "get_cpu_inputs", None))
        sizes = {k: v for k, v in vars(m).items()
                 if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("_") and k.islower()}
        self.shapes = [Shape(GPU_SHAPE, sizes)]
        self.cpu_shape = Shape(CPU_SHAPE, {})
        self._flops = _positive_number(m, "FLOPS", self.label)
        self._bytes = _positive_number(m, "BYTES_MOVED", self.label)
        self.tolerance_floor = _positive_number(m, "TOLERANCE_FLOOR", self.label) or 1e-5
        self.tolerance_alpha = _positive_number(m, "TOLERANCE_ALPHA", self.label) or 2.0
        self.refresh = getattr(m, "REFRESH", True)
        if not isinstance(self.refresh, bool):
            raise ProblemFileError(f"{self.label}: REFRESH must be True or False, got {self.refresh!r}")
        self.oracle_dtype = "float64"
        self.oracle_note = ""
        self._specs: dict = {}
        self._skeletons: dict = {}
        self._signatures: dict = {}
        self._facts: dict = {}
        self._compiled: dict = {}
        self._folder: Path | None = None
        self.distributions = ("plain", "scaled")
        # output names and whether any input is a float: from a probe on the meta device (no memory, no math)
        specs, floats = self._probe(self.shapes[0], cpu=False)
        self._n_outputs = len(specs)
        self._specs[(GPU_SHAPE, False)] = specs
        self.distributions = ("plain", "scaled") if floats else ("plain",)
        if self.has_cpu:
            self._decide_oracle_dtype()

    def _decide_oracle_dtype(self) -> None:
        """float64 unless the reference refuses it on the CPU inputs (small: every process that loads the
        problem decides the same, so the description the proposer reads names the oracle the workers use)."""
        import torch

        try:
            inputs = self.make_inputs(self.cpu_shape, "plain", 0, "cpu", cpu=True)
            self._forward(inputs, torch.float64)
        except (RuntimeError, NotImplementedError, TypeError) as e:
            self._use_float32(e)
        except Exception:  # noqa: BLE001 - a reference that fails otherwise is reported by check_cpu_run
            pass

    def _use_float32(self, e: Exception) -> None:
        self.oracle_dtype = "float32"
        self.oracle_note = f"float64 failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"

    # --- description ------------------------------------------------------------------------------
    @property
    def description(self) -> str:
        floor = "from FLOPS/BYTES_MOVED" if self.has_floor else "skipped (the file gives no FLOPS or BYTES_MOVED)"
        oracle = self.oracle_dtype + (f" ({self.oracle_note})" if self.oracle_note else "")
        cpu = "get_cpu_inputs()" if self.has_cpu else "none (the file has no get_cpu_inputs(): CPU runs are refused)"
        return (f"{self.label}: the file's Model (KernelBench format) as reference; oracle: the Model in {oracle}; "
                f"baseline: eager; inputs {', '.join(self.input_names())}; physical floor {floor}; CPU inputs {cpu}")

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(f"out{i}" for i in range(self._n_outputs))

    @property
    def has_floor(self) -> bool:
        return self._flops is not None or self._bytes is not None

    def input_names(self) -> list[str]:
        return [f"in{i}" for i in range(self._n_inputs)] + list(self._state_names)

    # --- the file's functions -------------------------------------------------------------------
    def _inputs_fn(self, shape: Shape) -> Callable[[], Any]:
        if shape.name == CPU_SHAPE:
            if not self.has_cpu:
                raise ProblemFileError(
                    f"{self.label} defines no get_cpu_inputs(): a run without CUDA (the Triton interpreter) "
                    f"needs small inputs from it")
            return self.mod.get_cpu_inputs
        if shape.name != GPU_SHAPE:
            raise ValueError(f"problem {self.name} has no shape {shape.name!r}")
        return self.mod.get_inputs

    def _init_args(self, shape: Shape) -> list:
        what = "get_init_inputs"
        if shape.name == CPU_SHAPE and callable(getattr(self.mod, "get_cpu_init_inputs", None)):
            what = "get_cpu_init_inputs"
        f = getattr(self.mod, what, None)
        args = f() if f is not None else []
        if not isinstance(args, (list, tuple)):
            raise ProblemFileError(f"{self.label}: {what}() must return a list, got {type(args).__name__}")
        return list(args)

    def _tensors(self, raw, what: str) -> list:
        import torch

        if isinstance(raw, torch.Tensor) or not isinstance(raw, (list, tuple)):
            raise ProblemFileError(f"{self.label}: {what}() must return a list of tensors, got {type(raw).__name__}")
        for i, t in enumerate(raw):
            if not isinstance(t, torch.Tensor):
                raise ProblemFileError(f"{self.label}: {what}() item {i} is a {type(t).__name__}, not a tensor "
                                       f"(constructor arguments belong in get_init_inputs())")
        return list(raw)

    def _out_list(self, out) -> list:
        import torch

        items = [out] if isinstance(out, torch.Tensor) else out
        if not isinstance(items, (list, tuple)) or not items or not all(isinstance(t, torch.Tensor) for t in items):
            raise ProblemFileError(f"{self.label}: Model.forward must return a tensor or a tuple of tensors, "
                                   f"got {type(out).__name__}")
        return list(items)

    def _probe(self, shape: Shape, cpu: bool) -> tuple[dict, bool]:
        """Output specs, from a forward on the meta device (shapes and dtypes only); where an op has no meta
        kernel, from a real forward on the CPU."""
        import torch

        fn = self._inputs_fn(shape)
        what = "get_cpu_inputs" if shape.name == CPU_SHAPE else "get_inputs"
        try:
            with torch.device("meta"), torch.no_grad():
                model = self.mod.Model(*self._init_args(shape))
                ins = self._tensors(fn(), what)
                self._signatures[shape.name] = self._signature(ins, model)
                if cpu:
                    ins = [t.float() if t.is_floating_point() else t for t in ins]
                    model = model.float()
                outs = self._out_list(model(*ins))
        except ProblemFileError:
            raise
        except Exception:  # noqa: BLE001 - no meta kernel: run it for real
            try:
                inputs = self.make_inputs(shape, "plain", 0, "cpu", cpu=cpu)
                model = self._skeleton(shape)
                n = sum(1 for k in inputs if re.fullmatch(r"in\d+", k))
                ins = [inputs[f"in{i}"] for i in range(n)]
                self._signatures[shape.name] = self._signature(ins, model)
                outs = list(self._forward(inputs, None).values())
            except ProblemFileError:
                raise
            except Exception as e:  # noqa: BLE001
                raise ProblemFileError(f"{self.label}: the reference raised {type(e).__name__}: {e}") from None
        self._n_inputs = len(ins)
        state = list(model.named_parameters()) + list(model.named_buffers())
        self._state_names = [n for n, _ in state]
        specs = {f"out{i}": OutputSpec(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for i, t in enumerate(outs)}
        self._facts[(shape.name, bool(cpu))] = [(f"in{i}", tuple(t.shape), str(t.dtype).removeprefix("torch."))
                                               for i, t in enumerate(ins)] + \
            [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in state]
        return specs, any(t.is_floating_point() for t in ins)

    def contract_text(self) -> str:
        """The candidate contract of this problem, with its inputs' and outputs' names, shapes and dtypes."""
        lines = [f"No starting kernel: this problem comes from the file {self.label}. A candidate is one module",
                 "defining run(inputs, out) that writes every output in place (Triton; the harness allocates out).",
                 "The reference is baseline.py: its Model.forward(in0, in1, ...); Model's parameters and buffers",
                 "are inputs too, under their names in the module. Model is built under each case's seed, its",
                 "parameters and buffers then scaled and shifted per case (none keeps a no-op value)."]
        for shape, cpu in ((self.shapes[0], False), (self.cpu_shape, True)):
            if shape.name == CPU_SHAPE and not self.has_cpu:
                lines.append(f"{CPU_SHAPE}: none (no CPU run)")
                continue
            specs = self.output_specs(shape, cpu=cpu)
            ins = "; ".join(f"{n} {d} {list(sh)}" for n, sh, d in self._facts[(shape.name, cpu)])
            outs = "; ".join(f"{n} {sp.dtype} {list(sp.shape)}" for n, sp in specs.items())
            lines.append(f"{shape.name}{' (CPU, float32)' if cpu else ''}: inputs {ins}; outputs {outs}")
        return "\n".join(lines)

    # --- inputs and outputs -----------------------------------------------------------------------
    def make_inputs(self, shape, distribution, seed, device, cpu=False):
        import torch

        if distribution not in self.distributions:
            raise ValueError(f"problem {self.name} has no distribution {distribution!r}")
        fn = self._inputs_fn(shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.mod.Model(*self._init_args(shape))
            raw = self._tensors(fn(), "get_cpu_inputs" if shape.name == CPU_SHAPE else "get_inputs")
        inputs = {}
        for i, t in enumerate(raw):
            t = t.detach()
            if cpu and t.is_floating_point():
                t = t.float()
            if distribution == "scaled" and t.is_floating_point():
                t = t * SCALE
            inputs[f"in{i}"] = t.to(device).contiguous()
        # the Model's own initialisation, scaled and shifted per case: no parameter keeps a value that makes
        # it a no-op (LayerNorm's weight 1, bias 0), so a kernel that ignores one fails
        varied = torch.Generator(device="cpu").manual_seed(PARAM_SEED ^ int(seed))
        for n, t in list(model.named_parameters()) + list(model.named_buffers()):
            t = vary_parameter(t.detach(), varied)
            if cpu and t.is_floating_point():
                t = t.float()
            inputs[n] = t.to(device).contiguous()
        return inputs

    # --- timing inputs seen once ------------------------------------------------------------------
    def perturbed(self, inputs, generator, distribution):
        """Every float tensor, the Model's parameters and buffers too, times small relative noise (signs and
        zeros kept); REFRESH = False: the drawn sets as they are."""
        return super().perturbed(inputs, generator, distribution) if self.refresh else inputs

    def output_specs(self, shape, cpu=False):
        k = (shape.name, bool(cpu))
        if k not in self._specs:
            self._specs[k] = self._probe(shape, cpu)[0]
        return self._specs[k]

    # --- references -------------------------------------------------------------------------------
    @staticmethod
    def _signature(ins: list, model) -> tuple:
        return (tuple(tuple(t.shape) for t in ins),
                tuple(sorted((n, tuple(t.shape)) for n, t in list(model.named_parameters()) + list(model.named_buffers()))))

    def _skeleton(self, shape: Shape):
        """Model built once per shape (its constructor arguments may differ); every call hands it the case's
        parameters and buffers (functional_call)."""
        import torch

        if shape.name not in self._skeletons:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                self._skeletons[shape.name] = self.mod.Model(*self._init_args(shape)).eval()
        return self._skeletons[shape.name]

    def _shape_of(self, args: tuple, state: dict) -> Shape:
        """Which of the file's input functions these inputs came from (they differ in sizes)."""
        sig = (tuple(tuple(t.shape) for t in args), tuple(sorted((n, tuple(t.shape)) for n, t in state.items())))
        if self.has_cpu and CPU_SHAPE not in self._signatures:
            self.output_specs(self.cpu_shape, cpu=True)
        for shape in (self.shapes[0], self.cpu_shape):
            if self._signatures.get(shape.name) == sig:
                return shape
        return self.shapes[0]

    def _forward(self, inputs: dict, dtype, compiled: bool = False) -> dict:
        import torch

        def cast(t):
            return t.to(dtype) if dtype is not None and t.is_floating_point() else t

        n = sum(1 for k in inputs if re.fullmatch(r"in\d+", k))
        args = tuple(cast(inputs[f"in{i}"]) for i in range(n))
        state = {k: cast(v) for k, v in inputs.items() if not re.fullmatch(r"in\d+", k)}
        model = self._skeleton(self._shape_of(args, state))
        with torch.no_grad():
            if compiled:
                key = id(model)
                if key not in self._compiled:
                    self._compiled[key] = torch.compile(lambda s, a: torch.func.functional_call(model, s, a))
                out = self._compiled[key](state, args)
            else:
                out = torch.func.functional_call(model, state, args)
        return {f"out{i}": t for i, t in enumerate(self._out_list(out))}

    def oracle(self, inputs):
        import torch

        if self.oracle_dtype == "float64":
            try:
                return self._forward(inputs, torch.float64)
            except (RuntimeError, NotImplementedError, TypeError) as e:
                self._use_float32(e)
                print(f"oracle: {self.label} in float32 ({self.oracle_note})", flush=True)
        return self._forward(inputs, torch.float32)

    def baselines(self):
        import torch

        def eager(inputs):
            return self._forward(inputs, None)

        bases = {"eager": eager}
        if torch.cuda.is_available():
            def compiled(inputs):
                return self._forward(inputs, None, compiled=True)

            bases["torch.compile"] = compiled
        return bases

    # --- roofline ---------------------------------------------------------------------------------
    def flops(self, shape):
        if shape.name != GPU_SHAPE or self._flops is None:
            raise NotImplementedError(f"{self.label} gives no FLOP count for {shape.name}")
        return self._flops

    def bytes_moved(self, shape):
        if shape.name != GPU_SHAPE or self._bytes is None:
            raise NotImplementedError(f"{self.label} gives no byte count for {shape.name}")
        return self._bytes

    def floor_ms(self, shape, bandwidth_Bps, flops_per_s):
        """From FLOPS and BYTES_MOVED (either may be left out); 0 (nothing is below it: the check is skipped)
        when the file gives neither."""
        if shape.name != GPU_SHAPE or not self.has_floor:
            return 0.0
        return 1e3 * max((self._bytes or 0.0) / bandwidth_Bps, (self._flops or 0.0) / flops_per_s)

    # --- sources for the proposer -------------------------------------------------------------------
    @property
    def folder(self) -> Path:
        """A folder holding the reference as baseline.py and oracle.py, for the tools that read a problem's
        sources, and kernel.py: no template (a file problem has none), the contract with its names and sizes."""
        if self._folder is None:
            root = Path(tempfile.gettempdir()) / f"marathon-problems-{os.getuid()}" / self.name.removeprefix(FILE_PREFIX)
            root.mkdir(parents=True, exist_ok=True)
            text = self.data.decode()
            files = {"baseline.py": "# the baseline: this file's Model.forward, eager, at the inputs' dtype\n" + text,
                     "oracle.py": f"# the oracle: this file's Model.forward in {self.oracle_dtype} (inputs and "
                                  f"parameters cast)\n" + text,
                     "kernel.py": '"""' + self.contract_text() + '\n"""\n\n\ndef run(inputs, out):\n'
                                  '    raise NotImplementedError("no starting kernel: write the Triton kernel")\n'}
            for fname, content in files.items():
                p = root / fname
                if not p.is_file() or p.read_text() != content:  # written whole, then renamed: readers never see half
                    fd, tmp = tempfile.mkstemp(dir=root, prefix=".tmp-")
                    with os.fdopen(fd, "w") as f:
                        f.write(content)
                    os.replace(tmp, p)
            self._folder = root
        return self._folder

    def template(self) -> str:
        raise LookupError(f"{self.label} is a problem file: it has no template kernel with a KNOBS line "
                          f"(use --policy llm)")

    def knob_space(self):
        return {}


def load_file(path: str | os.PathLike) -> tuple[str, bytes, ExternalProblem]:
    """(key, bytes, problem) for a file on disk; ProblemFileError with one line when it is not a problem."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ProblemFileError(f"{path}: cannot read the file: {e.strerror or e}") from None
    key = file_key(data)
    return key, data, ExternalProblem(key, data, str(path))


def cuda_here() -> bool:
    """Whether this process sees a CUDA device (the CLI asks: without one it takes a run for a CPU run)."""
    import torch

    return torch.cuda.is_available()


def check_cpu_run(problem: ExternalProblem) -> None:
    """What a CPU run needs, checked before it starts: CPU inputs, a reference that runs on them and gives
    the same outputs twice, an oracle with finite outputs. ProblemFileError otherwise."""
    import torch

    shape = problem.cpu_shape
    try:
        inputs = problem.make_inputs(shape, "plain", 0, "cpu", cpu=True)
    except ProblemFileError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ProblemFileError(f"{problem.label}: get_cpu_inputs() raised {type(e).__name__}: {e}") from None
    try:
        eager = next(iter(problem.baselines().values()))
        a, b = eager(inputs), eager(inputs)
        ref = problem.oracle(inputs)
    except ProblemFileError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ProblemFileError(f"{problem.label}: the reference raised {type(e).__name__}: {e}") from None
    specs = problem.output_specs(shape, cpu=True)
    for k in specs:
        if not torch.equal(a[k], b[k]):
            raise ProblemFileError(f"{problem.label}: the reference is not deterministic: two calls on the same "
                                   f"inputs gave different {k}")
        if not torch.isfinite(ref[k]).all():
            raise ProblemFileError(f"{problem.label}: the oracle's {k} has non-finite values on get_cpu_inputs()")


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
    import ast

    tree = ast.parse(data)
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


def load_key(key: str, store=None) -> ExternalProblem:
    """The problem stored under `key` (`file:<sha256>`) in the artifact store."""
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    if not is_file_key(key):
        raise UnknownProblem(f"{key!r} is not a problem file key (file:<64 hex digits>)")
    store = store or ArtifactStore()
    try:
        data = store.get_bytes(key.removeprefix(FILE_PREFIX))
    except ArtifactStoreError as e:
        raise UnknownProblem(f"problem {key[:17]}...: {e} (marathon start PATH stores the file)") from None
    return ExternalProblem(key, data)


# ---- the richer form: a problem folder outside the project ----------------------------------------------
FOLDER_PREFIX = "folder:"
FOLDER_KEY_RE = re.compile(r"^folder:[0-9a-f]{64}$")
#: what a problem folder holds: spec.py is required; the others are what the built-in problems have
FOLDER_FILES = ("spec.py", "oracle.py", "baseline.py", "kernel.py", "knobs.py")


def is_folder_key(name: str) -> bool:
    return bool(FOLDER_KEY_RE.match(name or ""))


def folder_manifest(files: dict[str, bytes]) -> tuple[str, dict]:
    """(key, manifest) of a folder's files: the manifest names each file's content key; the key is the
    manifest's own content key, as the artifact store computes it (put_json)."""
    import json

    manifest = {"kind": "problem-folder", "files": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(files.items())}}
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return FOLDER_PREFIX + hashlib.sha256(text).hexdigest(), manifest


def read_folder(path: str | os.PathLike) -> dict[str, bytes]:
    """The folder's top-level .py files (subfolders are not part of a problem folder)."""
    p = Path(path)
    try:
        files = {f.name: f.read_bytes() for f in sorted(p.iterdir()) if f.is_file() and f.suffix == ".py"}
    except OSError as e:
        raise ProblemFileError(f"{path}: cannot read the folder: {e.strerror or e}") from None
    if "spec.py" not in files:
        raise ProblemFileError(f"{path}: a problem folder needs a spec.py defining PROBLEM (docs/problems.md)")
    return files


def load_folder(root: Path, key: str, label: str) -> Problem:
    """spec.py's PROBLEM, imported as a package from `root` (its siblings are imported relatively:
    `from .oracle import ...`), named by `key` and reading its template and knobs from `root`."""
    import importlib

    pkg = "marathon_folder_" + key.removeprefix(FOLDER_PREFIX)[:16]
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(root)]
        mod.__file__ = str(root / "__init__.py")
        sys.modules[pkg] = mod
    try:
        spec = importlib.import_module(f"{pkg}.spec")
    except SyntaxError as e:
        raise ProblemFileError(f"{label}: {Path(e.filename or 'spec.py').name}: syntax error at line {e.lineno}: "
                               f"{e.msg}") from None
    except Exception as e:  # noqa: BLE001 - the folder's fault, said in one line
        for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
            del sys.modules[name]
        raise ProblemFileError(f"{label}: importing spec.py raised {type(e).__name__}: {e}") from None
    p = getattr(spec, "PROBLEM", None)
    if not isinstance(p, Problem):
        raise ProblemFileError(f"{label}: spec.py defines no PROBLEM (an instance of baselines.problem.Problem)")
    if not p.shapes or not p.distributions or not p.outputs:
        raise ProblemFileError(f"{label}: PROBLEM needs shapes, distributions and outputs")
    if getattr(p, "name", "") != key:
        p.own_name = p.name
        p.name = key  # workers and children find it by this key
    # the template and the knobs are read from the folder, wherever it lies
    p.__class__ = type(type(p).__name__, (type(p),), {"folder": property(lambda self: root)})
    return p


def load_folder_key(key: str, store=None) -> Problem:
    """The problem folder stored under `key` (`folder:<sha256 of its manifest>`), materialized once in a
    folder of its own (written whole, then renamed) and imported from there."""
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    if not is_folder_key(key):
        raise UnknownProblem(f"{key!r} is not a problem folder key (folder:<64 hex digits>)")
    store = store or ArtifactStore()
    digest = key.removeprefix(FOLDER_PREFIX)
    try:
        manifest = store.get_json(digest)
        files = {n: store.get_bytes(k) for n, k in manifest["files"].items()}
    except ArtifactStoreError as e:
        raise UnknownProblem(f"problem {key[:19]}...: {e} (marathon start PATH stores the folder)") from None
    except (KeyError, TypeError, AttributeError, ValueError):
        raise UnknownProblem(f"problem {key[:19]}...: the stored object is not a problem folder") from None
    root = Path(tempfile.gettempdir()) / f"marathon-problems-{os.getuid()}" / f"folder-{digest}"
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".tmp-"))
        for n, d in files.items():
            (tmp / Path(n).name).write_bytes(d)
        try:
            os.replace(tmp, root)
        except OSError:  # another process got there first: same content
            shutil.rmtree(tmp, ignore_errors=True)
    return load_folder(root, key, key[:19])


# ---- the second candidate form for problem files: KernelBench's ModelNew ------------------------------
#: the line `marathon export` writes between a kernel and the code that calls it in the problem's form;
#: the harness (and `marathon verify`) judges what lies above it
EXPORT_MARKER = "# ---- marathon export: the problem's calling form; the verified kernel is above this line ----"


def kernel_part(source: str) -> str:
    """The candidate of an exported kernel file (the part above EXPORT_MARKER); any other source as it is."""
    head, sep, _ = source.partition(EXPORT_MARKER)
    return head.rstrip("\n") + "\n" if sep else source


def _is_super_init(stmt) -> bool:
    """`super().__init__(...)`, `super(ModelNew, self).__init__(...)` or `nn.Module.__init__(self)`."""
    import ast

    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__")


def entry_source(source: str, problem: ExternalProblem) -> str:
    """A candidate written in KernelBench's form, `class ModelNew(nn.Module)` with Model's constructor and
    forward, as the entry-function form the harness calls: the class loses its base (the static rules allow
    no class with bases) and its `super().__init__()`, and a `run(inputs, out)` is added that builds
    ModelNew once per input size with the constructor arguments of that size (get_init_inputs() or
    get_cpu_init_inputs()), hands it the case's parameters and buffers under Model's names, calls forward
    on in0, in1, ... and copies what it returns into out0, out1, ... A source with a top-level `run`, or
    without ModelNew, is returned as it is (the rules judge it). ProblemFileError where the constructor
    arguments are not literals."""
    import ast

    source = kernel_part(source)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    if any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body):
        return source
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if cls is None:
        return source
    cls.bases, cls.keywords = [], []
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef):
            fn.body = [s for s in fn.body if not _is_super_init(s)] or [ast.Pass()]
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
        init_args.setdefault(sizes, args)
    params = {name for name, _ in problem._skeleton(problem.shapes[0]).named_parameters()}
    ins = ", ".join(f'inputs["in{i}"]' for i in range(n))
    lines = ["", "", "# the ModelNew form called as run(inputs, out)", "import torch as marathon_torch", "",
             "MARATHON_CANDIDATE = ModelNew  # bound here: an exported file defines a ModelNew of its own below",
             f"MARATHON_INIT_ARGS = {init_args!r}", "MARATHON_MODELS = {}", "", "",
             "def run(inputs, out):",
             f"    sizes = ({''.join(f'tuple(inputs[{chr(34)}in{i}{chr(34)}].shape), ' for i in range(n))})",
             "    model = MARATHON_MODELS.get(sizes)",
             "    if model is None:",
             "        model = MARATHON_CANDIDATE(*MARATHON_INIT_ARGS[sizes])",
             "        MARATHON_MODELS[sizes] = model"]
    for name in problem._state_names:
        value = f'inputs["{name}"]'
        if "." in name and name in params:  # a submodule's parameter slot takes a Parameter (sharing storage)
            value = f"marathon_torch.nn.Parameter({value}, requires_grad=False)"
        lines.append(f"    model.{name} = {value}")
    lines += [f"    result = model.forward({ins})",
              "    results = (result,) if isinstance(result, marathon_torch.Tensor) else tuple(result)"]
    lines += [f'    out["out{i}"].copy_(results[{i}])' for i in range(problem._n_outputs)]
    return ast.unparse(tree) + "\n".join(lines) + "\n"
