"""The split-scores mla_prefill design (baselines/mla_prefill/split_scores_kernel.py) under the Triton
interpreter (fp32) against the fp64 oracle on every distribution, beside the starting kernel, and the
candidate rules. The layouts the design is about (scores over [4, 2] warps, P @ V transposed) exist only
in the sm_90 compile: scripts/offline_compile_mla_prefill.py --template reports them (registers, spills,
shared memory)."""

from __future__ import annotations

import os

# the kernel runs under the Triton interpreter here; set before anything imports triton
os.environ["TRITON_INTERPRET"] = "1"

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from baselines.mla_prefill.spec import PROBLEM as P
from baselines.problem import Shape, rel_rms, render, start_kernel_knobs
from rules.check import check_source

FOLDER = Path(__file__).resolve().parents[2] / "baselines" / "mla_prefill"
SOURCE = (FOLDER / "split_scores_kernel.py").read_text()
SETTINGS = [json.loads(ln) for ln in (FOLDER / "split_scores_settings.jsonl").read_text().splitlines() if ln.strip()]


def load(knobs: dict, tmp_path, source: str = SOURCE):
    """The template rendered with `knobs` into a file and imported (Triton's JIT wants a source file)."""
    path = tmp_path / f"prefill_{abs(hash((source, repr(sorted(knobs.items())))))}.py"
    path.write_text(render(source, knobs))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prefill(mod, shape, dist, seed=0):
    x = P.make_inputs(shape, dist, seed=seed, device="cpu", cpu=True)
    out = {n: torch.full(s.shape, float("nan")) for n, s in P.output_specs(shape, cpu=True).items()}
    mod.run(x, out)
    return x, out


def shp(N, H=2, DL=128, DR=16):
    return Shape(f"N{N} H{H} DL{DL} DR{DR}", {"N": N, "H": H, "DL": DL, "DR": DR})


def test_candidate_passes_the_rules_and_is_a_starting_kernel():
    assert check_source(SOURCE, "mla_prefill").ok, check_source(SOURCE, "mla_prefill")
    knobs, space = start_kernel_knobs(SOURCE)
    for name, value in knobs.items():
        assert value in space[name], name
    for over in SETTINGS:  # every setting the timing command renders is a point of the space
        assert all(v in space[k] for k, v in over.items()), over


@pytest.mark.parametrize("over", SETTINGS, ids=[json.dumps(s) for s in SETTINGS])
@pytest.mark.parametrize("dist", P.distributions)
def test_settings_match_the_oracle_at_the_cpu_shape(over, dist, tmp_path):
    """N = 48 < BLOCK_M: one query block, its rows past N masked; the diagonal tile runs past the cache."""
    x, out = prefill(load(over, tmp_path), P.cpu_shape, dist)
    ref = P.oracle(x)["o"]
    assert torch.isfinite(out["o"]).all()
    assert rel_rms(ref, out["o"]) < 1e-5


# several query blocks (the unmasked loop runs, a tail block on the diagonal), a head count of 3, and the
# default's untaken branches compiled out (SPLIT_QK False) on the same shape
CASES = [({}, shp(150, H=3)), ({"BLOCK_N": 32}, shp(130)), ({"SPLIT_QK": False, "QR_REGS": False}, shp(150, H=3))]


@pytest.mark.parametrize("over,shape", CASES, ids=[f"{json.dumps(o)} {s.name}" for o, s in CASES])
def test_several_query_blocks_match_the_oracle(over, shape, tmp_path):
    x, out = prefill(load(over, tmp_path), shape, "peaked", seed=3)
    assert rel_rms(P.oracle(x)["o"], out["o"]) < 1e-5


@pytest.mark.parametrize("lazy", [8.0, 0.0, -1.0])
def test_rescaling_after_a_jump_of_the_row_max(lazy, tmp_path):
    """Cache rows 100.. scaled by 6: for the later queries the row max jumps by far more than 8 (log2 units)
    in a later tile, so the skipped and the taken rescale both run; exact against the oracle whatever the
    threshold (-1: rescale every tile, as the starting kernel)."""
    shape = shp(150)
    x = P.make_inputs(shape, "unit", seed=7, device="cpu", cpu=True)
    x["kv_cache"][100:] *= 6.0
    out = {"o": torch.full(P.output_specs(shape, cpu=True)["o"].shape, float("nan"))}
    load({"LAZY": lazy, "BLOCK_N": 32}, tmp_path).run(x, out)
    assert rel_rms(P.oracle(x)["o"], out["o"]) < 1e-5


def test_agrees_with_the_starting_kernel(tmp_path):
    x, out = prefill(load({}, tmp_path), shp(130), "unit", seed=5)
    start = load({}, tmp_path, (FOLDER / "kernel.py").read_text())
    base = {"o": torch.full_like(out["o"], float("nan"))}
    start.run(x, base)
    assert rel_rms(base["o"], out["o"]) < 1e-5


def test_non_contiguous_inputs_are_refused(tmp_path):
    """The kernel's strides are compile-time constants: a strided q is an error, not a wrong answer."""
    mod = load({}, tmp_path)
    x = P.make_inputs(P.cpu_shape, "unit", seed=0, device="cpu", cpu=True)
    wide = torch.zeros(x["q"].shape[0], x["q"].shape[1], x["q"].shape[2] + 8)
    wide[..., : x["q"].shape[2]] = x["q"]
    out = {"o": torch.empty(P.output_specs(P.cpu_shape, cpu=True)["o"].shape)}
    with pytest.raises(AssertionError):
        mod.run({"q": wide[..., : x["q"].shape[2]], "kv_cache": x["kv_cache"]}, out)
