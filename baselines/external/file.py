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
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from baselines.external.file_module import load_module, positive_number
from baselines.perturb import vary_parameter
from baselines.problem import OutputSpec, Problem, ProblemFileError, Shape, UnknownProblem

FILE_PREFIX = "file:"
KEY_RE = re.compile(r"^file:[0-9a-f]{64}$")
#: the factor of the `scaled` distribution on float inputs: a kernel tuned to one input's magnitude fails
SCALE = 8.0
GPU_SHAPE = "get_inputs"
CPU_SHAPE = "get_cpu_inputs"
#: mixed into a case's seed for the generator that varies the Model's parameters
PARAM_SEED = 0x5EED_9A7A


def is_file_key(name: str) -> bool:
    return bool(KEY_RE.match(name or ""))


def file_key(data: bytes) -> str:
    return FILE_PREFIX + hashlib.sha256(data).hexdigest()


class ExternalProblem(Problem):
    """The Problem interface over a KernelBench-format module (see the module's docstring)."""

    def __init__(self, key: str, data: bytes, label: str | None = None):
        self.name = key
        self.label = label or f"{key[:17]}"
        self.data = data
        self.mod = load_module(data, self.label, "marathon_problem_" + key.removeprefix(FILE_PREFIX)[:16])
        m = self.mod
        self.has_cpu = callable(getattr(m, "get_cpu_inputs", None))
        sizes = {k: v for k, v in vars(m).items()
                 if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("_") and k.islower()}
        self.shapes = [Shape(GPU_SHAPE, sizes)]
        self.cpu_shape = Shape(CPU_SHAPE, {})
        self._flops = positive_number(m, "FLOPS", self.label)
        self._bytes = positive_number(m, "BYTES_MOVED", self.label)
        self.tolerance_floor = positive_number(m, "TOLERANCE_FLOOR", self.label) or 1e-5
        self.tolerance_alpha = positive_number(m, "TOLERANCE_ALPHA", self.label) or 2.0
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

