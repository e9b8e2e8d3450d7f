"""The contract every problem folder fulfils.

A problem folder `baselines/<name>/` holds:
  spec.py      PROBLEM = <Problem subclass instance>: shapes, input generator, tolerance, FLOP/byte counts
  oracle.py    the high-precision reference (fp64/fp32), written in this project
  baseline.py  the adapter for the thing we race against (FLA, a PyTorch reference, ...)
  kernel.py    the starting kernel: a *candidate module* (see below), Triton, our own code
  knobs.py     SPACE: the knob values the search proposer may choose from

The candidate contract: a candidate is one Python module that defines

    run(inputs: dict[str, Tensor], out: dict[str, Tensor]) -> None

and writes every output tensor in place. The harness allocates `out` (and poisons it with NaN), so a
candidate can neither return lazy or cached tensors nor skip elements unnoticed. Templates carry their
knobs on exactly one line `KNOBS = {...}`; `render()` rewrites that line.

This module imports no torch at import time: the CLI and the workflow side only need names.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from baselines.parse import parse as parse_source

KNOBS_LINE = re.compile(r"^KNOBS\s*=\s*(\{.*\})\s*$", re.MULTILINE)


class UnknownProblem(ValueError):
    """A problem name, file key or folder key that names no problem (registry.py, external/)."""


class ProblemFileError(UnknownProblem):
    """A problem file or folder that cannot become a problem: one line that says why."""


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: a name for tables and the parameters the generator needs."""

    name: str
    params: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, key: str) -> int:
        return self.params[key]


@dataclass(frozen=True)
class OutputSpec:
    shape: tuple[int, ...]
    dtype: str  # a torch dtype name: "float32", "bfloat16", ...


RANDOM_SHAPE = "random "  # the name of a shape drawn from a problem's random_space starts so


class Problem:
    """Base class; a problem overrides the generator, oracle, baselines and roofline counts."""

    name: str = ""
    description: str = ""
    #: first shape is the primary GPU shape; `cpu_shape` is small enough for the Triton interpreter
    shapes: list[Shape] = []
    cpu_shape: Shape = Shape("cpu")
    distributions: tuple[str, ...] = ("normal",)
    #: pass iff rel-RMS error <= max(tolerance_floor, tolerance_alpha * baseline's own error)
    tolerance_floor: float = 1e-5
    tolerance_alpha: float = 2.0
    #: names of the outputs that are compared with the oracle, in order
    outputs: tuple[str, ...] = ("out",)
    #: make_inputs draws only from generators of its own, so cases may be drawn on several threads at once
    #: (torch's global generator is one per process: a draw from it on two threads interleaves)
    own_generators: bool = False

    @property
    def folder(self) -> Path:
        return Path(__file__).parent / self.name

    # --- inputs and outputs -------------------------------------------------------------------
    def make_inputs(self, shape: Shape, distribution: str, seed: int, device: str, cpu: bool = False) -> dict:
        """Fresh inputs. `cpu=True` asks for fp32 everywhere (the Triton interpreter's safe dtype)."""
        raise NotImplementedError

    def output_specs(self, shape: Shape, cpu: bool = False) -> dict[str, OutputSpec]:
        raise NotImplementedError

    # --- references ---------------------------------------------------------------------------
    def oracle(self, inputs: dict) -> dict:
        """High-precision outputs (fp64 where it matters)."""
        raise NotImplementedError

    def baselines(self) -> dict[str, Callable[[dict], dict]]:
        """Name -> callable(inputs) -> outputs. The first one is the primary baseline."""
        raise NotImplementedError

    def baseline_env(self) -> str:
        """What the primary baseline ran with in this process beyond its name and the versions a receipt
        names (a library's switches, where its tuning came from); "" when nothing."""
        return ""

    # --- roofline -----------------------------------------------------------------------------
    def flops(self, shape: Shape) -> float:
        raise NotImplementedError

    def bytes_moved(self, shape: Shape) -> float:
        raise NotImplementedError

    def floor_ms(self, shape: Shape, bandwidth_Bps: float, flops_per_s: float) -> float:
        """Physical lower bound: the slower of moving the minimum bytes and doing the FLOPs."""
        return 1e3 * max(self.bytes_moved(shape) / bandwidth_Bps, self.flops(shape) / flops_per_s)

    # --- the starting kernel and its knobs -------------------------------------------------------
    def template(self) -> str:
        return (self.folder / "kernel.py").read_text()

    def knob_space(self) -> dict[str, list[Any]]:
        ns: dict[str, Any] = {}
        exec(compile((self.folder / "knobs.py").read_text(), str(self.folder / "knobs.py"), "exec"), ns)
        return dict(ns["SPACE"])

    def default_knobs(self) -> dict[str, Any]:
        return default_knobs(self.template())

    def render(self, knobs: dict[str, Any]) -> str:
        return render(self.template(), knobs)

    # --- timing inputs seen once ------------------------------------------------------------------
    def perturbed(self, inputs: dict, generator, distribution: str) -> dict:
        """New inputs of `distribution` made from `inputs` (a timing pool set, on the device) and values
        drawn from `generator` (a torch.Generator on the same device): every timed repetition gets its own,
        so no memo keyed on the contents, or on anything the change leaves (a row's values, their order),
        meets them twice, and the answer moves far beyond the tolerance. The result must stay valid inputs
        (normalised where the problem normalises, within each input's range) of the same shapes and dtypes;
        `inputs` is left as it is. Default: every float tensor times small relative noise (signs, zeros and
        the mean kept: baselines.perturb.relative_noise)."""
        from baselines.perturb import default_perturbed

        return default_perturbed(inputs, generator)

    # --- shapes a verification draws -------------------------------------------------------------
    def random_space(self, cpu: bool) -> dict[str, tuple[int, ...]] | None:
        """The values a random shape may give each parameter it varies (the others stay as at the base
        shape: the CPU shape on the interpreter, else the first listed). A would-be best is also verified
        at one such shape, drawn secretly each time, so a kernel written for the listed shapes alone fails.
        None: this problem has no random shapes (the listed ones are all its kernels must serve)."""
        return None

    def random_shape(self, rng, cpu: bool) -> Shape | None:
        """A shape drawn from `random_space` with `rng` (a random.Random), named by its parameters."""
        space = self.random_space(cpu)
        if not space:
            return None
        params = dict((self.cpu_shape if cpu else self.shapes[0]).params)
        for k, values in space.items():
            params[k] = rng.choice(list(values))
        return Shape(RANDOM_SHAPE + " ".join(f"{k}={v}" for k, v in params.items()), params)

    def shape_named(self, name: str) -> Shape | None:
        """A listed shape, the CPU shape, or a random shape (by the name `random_shape` gives it, checked
        against `random_space`); None for any other name."""
        for s in list(self.shapes) + [self.cpu_shape]:
            if s.name == name:
                return s
        if not name.startswith(RANDOM_SHAPE):
            return None
        try:
            params = {k: int(v) for k, v in (w.split("=", 1) for w in name[len(RANDOM_SHAPE):].split())}
        except ValueError:
            return None
        for cpu in (True, False):
            space = self.random_space(cpu) or {}
            base = (self.cpu_shape if cpu else self.shapes[0]).params
            if space and set(params) == set(base) and all(
                    params[k] in space[k] if k in space else params[k] == base[k] for k in params):
                return Shape(name, params)
        return None


def default_knobs(source: str) -> dict[str, Any]:
    m = KNOBS_LINE.search(source)
    if not m:
        raise ValueError("template has no 'KNOBS = {...}' line")
    return ast.literal_eval(m.group(1))


def start_kernel_knobs(source: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(KNOBS, KNOB_SPACE) of a starting kernel handed in for the search policy: a template with a
    `KNOBS = {...}` line (its defaults) and a module-level `KNOB_SPACE = {name: [values, ...]}` literal (what
    the search may set each knob to, the default among them; knobs not named stay at their default).
    ValueError with one line saying what is wrong."""
    try:
        tree = parse_source(source)
    except SyntaxError as e:
        raise ValueError(f"syntax error at line {e.lineno}: {e.msg}") from None
    defaults = default_knobs(source)
    found = [node.value for node in tree.body if isinstance(node, ast.Assign)
             and [getattr(t, "id", None) for t in node.targets] == ["KNOB_SPACE"]]
    if len(found) != 1:
        raise ValueError("needs one module-level KNOB_SPACE = {knob: [values, ...]} literal (the values the "
                         "search may try)")
    try:
        space = ast.literal_eval(found[0])
    except ValueError:
        raise ValueError("KNOB_SPACE must be a literal dict of lists of constants") from None
    if not isinstance(space, dict) or not space:
        raise ValueError("KNOB_SPACE must be a non-empty dict {knob: [values, ...]}")
    for name, values in space.items():
        if name not in defaults:
            raise ValueError(f"KNOB_SPACE names {name!r}, which KNOBS has not; KNOBS has {sorted(defaults)}")
        if not isinstance(values, list) or not values or len(set(map(repr, values))) != len(values):
            raise ValueError(f"KNOB_SPACE[{name!r}] must be a non-empty list of distinct values")
        if defaults[name] not in values:
            raise ValueError(f"KNOB_SPACE[{name!r}] does not hold KNOBS' value {defaults[name]!r}")
    return defaults, space


def render(source: str, knobs: dict[str, Any]) -> str:
    """The template with its KNOBS line replaced; unknown knob names are an error, not a silent no-op."""
    base = default_knobs(source)
    unknown = set(knobs) - set(base)
    if unknown:
        raise ValueError(f"unknown knobs {sorted(unknown)}; this template has {sorted(base)}")
    merged = {**base, **knobs}
    line = "KNOBS = " + repr(dict(sorted(merged.items())))
    return KNOBS_LINE.sub(lambda _m: line, source, count=1)


def rel_rms(ref, out) -> float:
    """RMS(ref - out) / RMS(ref), in float64 on `ref`'s device. NaN if either has a non-finite element."""
    import torch

    r = ref.detach().to(torch.float64)
    o = out.detach().to(r.device, torch.float64)
    if r.shape != o.shape:
        raise ValueError(f"shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    if not torch.isfinite(o).all() or not torch.isfinite(r).all():
        return math.nan
    den = r.pow(2).mean().sqrt().item()
    num = (r - o).pow(2).mean().sqrt().item()
    return num / (den + 1e-30)
