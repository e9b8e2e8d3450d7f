"""Random shapes: every built-in problem names the values a verification's random shape may take; a drawn
shape's name resolves back to it (in the worker and in the sandbox child alike) and no other name does; the
starting kernels are right at the corners of those spaces, under the interpreter here and, gpu-marked, on a
GPU."""

from __future__ import annotations

import os

# the starting kernels run under the Triton interpreter here; set before anything imports triton
os.environ["TRITON_INTERPRET"] = "1"

import importlib.util
import random

import pytest
import torch

from baselines.problem import RANDOM_SHAPE, Shape, rel_rms
from baselines.registry import get_problem
from tests.baselines.gpu_kernel_check import assert_passes, check_all

BUILT_IN = ("softmax", "kda", "mla_decode", "mla_prefill")


def corners(problem, cpu: bool) -> list[Shape]:
    """The smallest and the largest value of every parameter the space varies, as two shapes."""
    space = problem.random_space(cpu)
    base = (problem.cpu_shape if cpu else problem.shapes[0]).params
    out = []
    for pick in (min, max):
        params = {**base, **{k: pick(v) for k, v in space.items()}}
        out.append(Shape(RANDOM_SHAPE + " ".join(f"{k}={v}" for k, v in params.items()), params))
    return out


@pytest.mark.parametrize("name", BUILT_IN)
@pytest.mark.parametrize("cpu", [True, False])
def test_a_drawn_shape_resolves_by_its_name_and_stays_in_its_space(name, cpu):
    p = get_problem(name)
    space = p.random_space(cpu)
    base = (p.cpu_shape if cpu else p.shapes[0]).params
    rng = random.Random(7)
    seen = set()
    for _ in range(200):
        s = p.random_shape(rng, cpu)
        assert s.name.startswith(RANDOM_SHAPE) and p.shape_named(s.name) == s
        assert all(s.params[k] in space[k] if k in space else s.params[k] == base[k] for k in base)
        seen.add(tuple(sorted(s.params.items())))
    assert len(seen) > 1  # it does vary


@pytest.mark.parametrize("name", BUILT_IN)
def test_names_outside_the_space_resolve_to_nothing(name):
    p = get_problem(name)
    good = p.random_shape(random.Random(1), cpu=True)
    k = next(iter(p.random_space(True)))
    bad_value = good.name.replace(f"{k}={good.params[k]}", f"{k}=999999")
    assert p.shape_named(bad_value) is None
    assert p.shape_named(good.name + " extra=1") is None
    assert p.shape_named(RANDOM_SHAPE + "garbage") is None and p.shape_named("no such shape") is None
    assert p.shape_named(p.shapes[0].name) == p.shapes[0] and p.shape_named(p.cpu_shape.name) == p.cpu_shape


def test_a_problem_without_a_space_draws_no_random_shape():
    from baselines.problem import Problem

    assert Problem().random_shape(random.Random(0), cpu=True) is None


def run_start(p, shape: Shape, dist: str, tmp_path) -> dict:
    path = tmp_path / f"start_{p.name}.py"
    path.write_text(p.render(p.default_knobs()))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    x = p.make_inputs(shape, dist, seed=3, device="cpu", cpu=True)
    out = {n: torch.full(o.shape, float("nan"), dtype=getattr(torch, o.dtype))
           for n, o in p.output_specs(shape, cpu=True).items()}
    mod.run(x, out)
    ref = p.oracle(x)
    from gpu_worker.child import compared_outputs

    return {n: rel_rms(ref[n], out[n]) for n in compared_outputs(p, shape, True)}


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_starting_kernel_is_right_at_the_corners_of_the_cpu_space(name, tmp_path):
    p = get_problem(name)
    for shape in corners(p, cpu=True):
        for dist in p.distributions:
            errs = run_start(p, shape, dist, tmp_path)
            assert all(e <= p.tolerance_floor for e in errs.values()), (shape.name, dist, errs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", BUILT_IN)
def test_the_starting_kernel_is_right_at_the_corners_of_the_gpu_space(name):
    p = get_problem(name)
    cases = [(shape.name, dist) for shape in corners(p, cpu=False) for dist in p.distributions]
    for case, res in zip(cases, check_all(name, cases)):  # one child process for them all
        assert_passes(res, case)
