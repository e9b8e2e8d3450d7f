"""CPU tests for the mla_decode and mla_prefill problem folders (+ `gpu`-marked checks on the primary shapes).

The Triton kernels run under the interpreter in ONE subprocess per problem (TRITON_INTERPRET must be set
before triton is imported, and this pytest process may already have imported triton with it off). The
subprocess renders the template for several knob settings, runs it on the cpu_shape for every
distribution with NaN-poisoned outputs, and reports rel-RMS errors against the fp64 oracle as JSON.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from baselines.mla_decode.oracle import mla_decode_fp64
from baselines.mla_decode.spec import SCALE, latent_dim
from baselines.mla_prefill.oracle import mla_prefill_fp64
from baselines.problem import Shape, default_knobs, rel_rms
from baselines.registry import get_problem
from tests.baselines.gpu_kernel_check import assert_passes, check

ROOT = Path(__file__).resolve().parents[2]
DEC = get_problem("mla_decode")
PRE = get_problem("mla_prefill")

# knob settings run under the interpreter (cpu_shape: decode S=100, Q*H=8 rows; prefill N=48)
DECODE_KNOBS = [
    {},  # the template's defaults
    {"BLOCK_H": 16, "BLOCK_N": 16, "GRID": 8},  # 7 splits of one tile, the last one masked
    {"BLOCK_H": 32, "BLOCK_N": 64, "GRID": 1},  # one split, tail tile masked
    {"BLOCK_H": 64, "BLOCK_N": 32, "GRID": 3, "PDL": True},  # PDL is ignored off the GPU
    {"BLOCK_H": 16, "BLOCK_N": 32, "GRID": 8, "SPLIT_DV": 2, "PARTIAL_BF16": True, "COMBINE_TILE": 2048},
    {"SPLIT_DV": 1, "num_warps": 8, "BLOCK_N": 16, "MIN_TILES": 2},  # splits of 2 tiles, the last one cut short
    {"GRID": 256, "num_stages": 1, "BLOCK_N": 16},  # two-per-SM setting: 7 splits of one tile, the last masked
    # one launch, one-step reduction: 4 splits (the last masked) x 2 halves, one item per row (8 programs)
    {"FUSED": True, "REDUCE_D": 256, "COMBINE_TILE": 16384},
    # the same with 2 splits: items of 2 rows x 2 splits x 128 columns (4 programs, 4 items)
    {"FUSED": True, "REDUCE_D": 256, "COMBINE_TILE": 16384, "BLOCK_N": 64, "num_stages": 2, "PREFETCH": False},
]
PREFILL_KNOBS = [
    {},
    {"BLOCK_M": 32, "BLOCK_N": 16, "SPLIT_DV": 2},
    {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_DV": 1},  # BLOCK_N > BLOCK_M: the diagonal loop starts below
    {"BLOCK_M": 64, "BLOCK_N": 32, "SPLIT_DV": 1},  # one query block holding all 48 queries
    {"BLOCK_H": 2},  # both heads of the cpu_shape in one program: 128 score rows
    {"BLOCK_H": 4, "BLOCK_M": 32, "BLOCK_N": 16, "SPLIT_DV": 2},  # H = 2 < BLOCK_H: half the rows are masked heads
]

# BLOCK_H on wider head counts (the cpu_shape has H = 2): (H, knobs); run on N = 40 (not a multiple of 32)
PREFILL_BLOCK_H_CASES = [
    (8, {"BLOCK_H": 1, "BLOCK_M": 32, "BLOCK_N": 16}),
    (8, {"BLOCK_H": 2, "BLOCK_M": 32, "BLOCK_N": 16}),  # 4 head blocks, 2 query blocks
    (8, {"BLOCK_H": 2, "BLOCK_M": 64, "BLOCK_N": 32, "SPLIT_DV": 2}),
    (8, {"BLOCK_H": 4, "BLOCK_M": 32, "BLOCK_N": 16}),  # 2 head blocks
    (8, {"BLOCK_H": 4, "BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_DV": 2}),  # BLOCK_N > BLOCK_M
    (8, {"BLOCK_H": 4, "BLOCK_M": 64, "BLOCK_N": 64}),  # 256 score rows, one query block
    (6, {"BLOCK_H": 4, "BLOCK_M": 32, "BLOCK_N": 32}),  # 6 % 4 != 0: the second head block is half masked
    (6, {"BLOCK_H": 2, "BLOCK_M": 32, "BLOCK_N": 32}),
]

_CHILD = textwrap.dedent(
    """
    import importlib.util, json, os, sys, tempfile
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, sys.argv[1])
    import torch
    from baselines.problem import Shape, rel_rms
    from baselines.registry import get_problem
    prob = get_problem(sys.argv[2])
    # optional: a shape's params (default: the cpu_shape) and the distributions to run (default: all)
    shape = Shape("test", json.loads(sys.argv[4])) if len(sys.argv) > 4 and sys.argv[4] else prob.cpu_shape
    dists = json.loads(sys.argv[5]) if len(sys.argv) > 5 else list(prob.distributions)
    results = []
    tmp = tempfile.mkdtemp()
    for i, knobs in enumerate(json.loads(sys.argv[3])):
        path = os.path.join(tmp, f"cand_{i}.py")
        with open(path, "w") as f:
            f.write(prob.render(knobs))
        spec = importlib.util.spec_from_file_location(f"cand_{i}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for seed, dist in enumerate(dists):
            inputs = prob.make_inputs(shape, dist, 100 + seed, "cpu", cpu=True)
            out = {k: torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype))
                   for k, s in prob.output_specs(shape, cpu=True).items()}
            mod.run(inputs, out)
            ref = prob.oracle(inputs)["o"]
            results.append({"knobs": knobs, "dist": dist, "nan": bool(torch.isnan(out["o"]).any()),
                            "err": rel_rms(ref, out["o"])})
    print(json.dumps(results))
    """
)


def _interpret(problem: str, knob_list: list[dict], shape: dict | None = None,
               dists: list[str] | None = None) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    extra = [json.dumps(shape) if shape else ""] + ([json.dumps(dists)] if dists else [])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), problem, json.dumps(knob_list), *extra],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def decode_results():
    return _interpret("mla_decode", DECODE_KNOBS)


@pytest.fixture(scope="module")
def prefill_results():
    return _interpret("mla_prefill", PREFILL_KNOBS)


@pytest.fixture(scope="module")
def prefill_block_h_results():
    """{H: results} for PREFILL_BLOCK_H_CASES, one subprocess per head count, distribution "peaked"."""
    out = {}
    for H in sorted({h for h, _ in PREFILL_BLOCK_H_CASES}):
        knob_list = [k for h, k in PREFILL_BLOCK_H_CASES if h == H]
        res = _interpret("mla_prefill", knob_list, {"N": 40, "H": H, "DL": 128, "DR": 16}, ["peaked"])
        out[H] = res
    return out


def _prefill_space_values() -> list[dict]:
    """Every value of every knob in SPACE, one knob changed from the template's defaults at a time."""
    return [{k: v} for k, vals in PRE.knob_space().items() for v in vals]


@pytest.fixture(scope="module")
def prefill_space_results():
    return _interpret("mla_prefill", _prefill_space_values(), dists=["unit"])


# --- naive references: one (query, head) at a time, plain python loops over heads ---------------------


def naive_decode(q, cache, dl, scale):
    q, cache = q.double(), cache.double()
    Q, H, _ = q.shape
    out = torch.empty(Q, H, dl, dtype=torch.float64)
    for t in range(Q):
        for h in range(H):
            s = torch.mv(cache, q[t, h]) * scale
            w = torch.exp(s - s.max())
            out[t, h] = (w / w.sum()) @ cache[:, :dl]
    return out


def naive_prefill(q, cache, dl, scale):
    q, cache = q.double(), cache.double()
    N, H, _ = q.shape
    out = torch.empty(N, H, dl, dtype=torch.float64)
    for i in range(N):
        for h in range(H):
            s = torch.mv(cache[: i + 1], q[i, h]) * scale
            w = torch.exp(s - s.max())
            out[i, h] = (w / w.sum()) @ cache[: i + 1, :dl]
    return out


# --- oracles --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("Q,H,S,DR", [(1, 3, 37, 2), (2, 4, 100, 16), (3, 2, 5, 1)])
def test_decode_oracle_matches_naive_loop(Q, H, S, DR):
    g = torch.Generator().manual_seed(Q * 1000 + S)
    D = 9 * DR
    q = torch.randn(Q, H, D, generator=g) * 2
    cache = torch.randn(S, D, generator=g)
    got = mla_decode_fp64(q, cache, 8 * DR, SCALE)
    want = naive_decode(q, cache, 8 * DR, SCALE)
    assert got.dtype == torch.float64 and got.shape == (Q, H, 8 * DR)
    assert rel_rms(want, got) < 1e-13


@pytest.mark.parametrize("N,H,DR,chunk", [(7, 2, 2, None), (33, 3, 16, 5), (48, 2, 16, 1)])
def test_prefill_oracle_matches_naive_loop(N, H, DR, chunk):
    g = torch.Generator().manual_seed(N)
    D = 9 * DR
    q = torch.randn(N, H, D, generator=g) * 2
    cache = torch.randn(N, D, generator=g)
    got = mla_prefill_fp64(q, cache, 8 * DR, SCALE, chunk=chunk)
    want = naive_prefill(q, cache, 8 * DR, SCALE)
    assert rel_rms(want, got) < 1e-13
    # query 0 sees only cache row 0: its output is exactly that row's latent part
    assert torch.allclose(got[0], cache[0, : 8 * DR].double().expand(H, -1), rtol=0, atol=1e-12)


def test_oracle_uses_scale_1_over_sqrt_192():
    assert SCALE == pytest.approx(1 / math.sqrt(192))
    inputs = DEC.make_inputs(DEC.cpu_shape, "unit", 0, "cpu", cpu=True)
    want = naive_decode(inputs["q"], inputs["kv_cache"], 128, 1 / math.sqrt(192))
    wrong = naive_decode(inputs["q"], inputs["kv_cache"], 128, 1 / math.sqrt(576))
    got = DEC.oracle(inputs)["o"]
    assert rel_rms(want, got) < 1e-13
    assert rel_rms(wrong, got) > 1e-2  # the 1/sqrt(576) convention is far off: the check can fail


def test_latent_dim_rule():
    assert latent_dim(576) == 512 and latent_dim(144) == 128
    with pytest.raises(ValueError):
        latent_dim(100)


# --- baselines ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("prob", [DEC, PRE], ids=["decode", "prefill"])
@pytest.mark.parametrize("dist", ["unit", "small", "peaked"])
def test_baselines_match_oracle_fp32(prob, dist):
    inputs = prob.make_inputs(prob.cpu_shape, dist, 7, "cpu", cpu=True)
    ref = prob.oracle(inputs)["o"]
    for name, fn in prob.baselines().items():
        out = fn(inputs)["o"]
        assert out.shape == ref.shape and out.dtype == torch.float32, name
        assert rel_rms(ref, out) < 1e-5, name


@pytest.mark.parametrize("prob", [DEC, PRE], ids=["decode", "prefill"])
def test_baselines_bf16_error_is_bf16_sized(prob):
    """On bf16 inputs (CPU) the baselines land in the bf16 band: not exact, not broken."""
    inputs = prob.make_inputs(prob.cpu_shape, "unit", 3, "cpu", cpu=False)
    assert inputs["q"].dtype == torch.bfloat16
    ref = prob.oracle(inputs)["o"]
    for name, fn in prob.baselines().items():
        out = fn(inputs)["o"]
        assert out.dtype == torch.bfloat16, name
        assert 1e-4 < rel_rms(ref, out) < 2e-2, name


def test_prefill_baselines_primary_first():
    assert list(PRE.baselines()) == ["torch-ref", "torch-sdpa"]
    assert list(DEC.baselines())[0] == "torch-bmm"


# --- generators -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("prob", [DEC, PRE], ids=["decode", "prefill"])
def test_generators(prob):
    sh = prob.cpu_shape
    a = prob.make_inputs(sh, "unit", 1, "cpu", cpu=True)
    b = prob.make_inputs(sh, "unit", 1, "cpu", cpu=True)
    c = prob.make_inputs(sh, "unit", 2, "cpu", cpu=True)
    small = prob.make_inputs(sh, "small", 1, "cpu", cpu=True)
    peaked = prob.make_inputs(sh, "peaked", 1, "cpu", cpu=True)
    D = sh["DL"] + sh["DR"]
    rows = sh["Q"] if prob is DEC else sh["N"]
    assert a["q"].shape == (rows, sh["H"], D) and a["q"].dtype == torch.float32
    assert a["kv_cache"].shape == ((sh["S"] if prob is DEC else sh["N"]), D)
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["kv_cache"], b["kv_cache"])
    assert not torch.equal(a["q"], c["q"])
    assert torch.allclose(small["q"] * 10, a["q"], atol=1e-5)
    assert torch.allclose(peaked["q"], a["q"] * 4)
    assert torch.equal(small["kv_cache"], a["kv_cache"])
    assert 0.8 < a["kv_cache"].std().item() < 1.2
    gpu_like = prob.make_inputs(sh, "unit", 1, "cpu", cpu=False)
    assert gpu_like["q"].dtype == torch.bfloat16 and gpu_like["kv_cache"].dtype == torch.bfloat16
    spec = prob.output_specs(sh, cpu=True)["o"]
    assert spec.shape == (rows, sh["H"], sh["DL"]) and spec.dtype == "float32"
    assert prob.output_specs(prob.shapes[0])["o"].dtype == "bfloat16"
    with pytest.raises(ValueError):
        prob.make_inputs(sh, "nope", 1, "cpu", cpu=True)


def test_shapes():
    assert [s.name for s in DEC.shapes] == ["B1 H64 S8192 Q1", "B1 H64 S8192 Q4"]
    assert DEC.shapes[1]["Q"] == 4 and DEC.output_specs(DEC.shapes[1])["o"].shape == (4, 64, 512)
    assert PRE.output_specs(PRE.shapes[0])["o"].shape == (8192, 64, 512)
    assert DEC.cpu_shape["S"] % 16 != 0 and PRE.cpu_shape["N"] % 32 != 0
    assert len(DEC.distributions) >= 2 and len(PRE.distributions) >= 2


# --- roofline counts ------------------------------------------------------------------------------------


def test_flops_bytes_hand_computed():
    d1, d4 = DEC.shapes
    assert DEC.flops(d1) == 2 * 64 * 8192 * (576 + 512) == 1_140_850_688
    assert DEC.bytes_moved(d1) == 2 * (8192 * 576 + 64 * 576 + 64 * 512) == 9_576_448
    assert DEC.flops(d4) == 4_563_402_752
    assert DEC.bytes_moved(d4) == 9_994_240
    p = PRE.shapes[0]
    assert PRE.flops(p) == 64 * 1088 * 8192 * 8193 == 4_673_494_843_392  # 4.67 TFLOP
    assert PRE.bytes_moved(p) == 1_150_287_872  # 1.15 GB
    # floors at the measured H200 ceilings (4.27 TB/s copy, 687 TFLOP/s bf16 matmul)
    assert DEC.floor_ms(d1, 4.27e12, 687e12) == pytest.approx(2.24e-3, rel=0.01)
    assert PRE.floor_ms(p, 4.27e12, 687e12) == pytest.approx(6.80, rel=0.01)
    tiny = Shape("t", {"N": 3, "H": 1, "DL": 8, "DR": 1})
    assert PRE.flops(tiny) == 2 * (9 + 8) * 6  # 6 causal pairs


# --- knob spaces ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("prob", [DEC, PRE], ids=["decode", "prefill"])
def test_knob_space_matches_template(prob):
    space = prob.knob_space()
    defaults = prob.default_knobs()
    assert set(space) == set(defaults)
    for k, v in defaults.items():
        assert v in space[k], k
    src = prob.template()
    assert sum(line.startswith("KNOBS = ") for line in src.splitlines()) == 1
    rendered = prob.render({k: vals[-1] for k, vals in space.items()})
    assert default_knobs(rendered) == {k: vals[-1] for k, vals in space.items()}
    with pytest.raises(ValueError):
        prob.render({"NOT_A_KNOB": 1})


# --- the starting kernels under the Triton interpreter -----------------------------------------------------


def _check(results, knob_list, prob):
    assert len(results) == len(knob_list) * len(prob.distributions)
    for r in results:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r  # fp32 throughout on the CPU


def test_decode_kernel_interpreter(decode_results):
    _check(decode_results, DECODE_KNOBS, DEC)


def test_prefill_kernel_interpreter(prefill_results):
    _check(prefill_results, PREFILL_KNOBS, PRE)


@pytest.mark.parametrize("case", range(len(PREFILL_BLOCK_H_CASES)),
                         ids=[f"H{h}-" + "-".join(f"{k}{v}" for k, v in kn.items()) for h, kn in PREFILL_BLOCK_H_CASES])
def test_prefill_kernel_block_h_interpreter(prefill_block_h_results, case):
    """BLOCK_H heads per program against the fp64 oracle on N = 40, H = 6 / 8 (divisible or not)."""
    H, knobs = PREFILL_BLOCK_H_CASES[case]
    res = prefill_block_h_results[H]
    (r,) = [r for r in res if r["knobs"] == knobs]
    assert not r["nan"], r
    assert r["err"] < 1e-5, r


def test_prefill_space_block_h():
    space = PRE.knob_space()
    assert space["BLOCK_H"] == [1, 2, 4]
    assert PRE.default_knobs()["BLOCK_H"] == 1  # the one-head-per-program kernel stays the default
    assert all(PRE.shapes[0]["H"] % bh == 0 for bh in space["BLOCK_H"])  # 64 heads: no masked head rows on GPU
    assert math.prod(len(v) for v in space.values()) >= 200  # enough settings for a 200-evaluation search


def test_prefill_every_space_value_accepted(prefill_space_results):
    """Each knob value in SPACE renders into the template and runs correctly under the interpreter."""
    values = _prefill_space_values()
    for kn in values:
        assert default_knobs(PRE.render(kn)) == {**PRE.default_knobs(), **kn}
    assert len(prefill_space_results) == len(values)
    for r in prefill_space_results:
        assert not r["nan"], r
        assert r["err"] < 1e-5, r


# --- GPU (skipped without CUDA) ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dist", ["unit", "small"])
@pytest.mark.parametrize("idx", [0, 1])
def test_decode_kernel_gpu(idx, dist):
    assert_passes(check("mla_decode", idx, dist))


@pytest.mark.gpu
def test_prefill_kernel_gpu():
    assert_passes(check("mla_prefill", 0, "unit"))
