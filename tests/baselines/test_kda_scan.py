"""The segmented-scan KDA design (baselines/kda/scan_kernel.py) and its torch reference
(baselines/kda/scan_reference.py): the algebra in fp64 against the recurrence, the Triton kernel under the
interpreter (fp32) against the problem's oracle on every distribution, and the candidate rules."""

from __future__ import annotations

import os

# the kernel runs under the Triton interpreter here; set before anything imports triton
os.environ["TRITON_INTERPRET"] = "1"

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from baselines.kda import oracle
from baselines.kda import scan_reference as sr
from baselines.kda.spec import PROBLEM as P
from baselines.problem import Shape, rel_rms, render, start_kernel_knobs
from rules.check import check_source
from tests.baselines.test_kda import extreme_gates

KDA = Path(__file__).resolve().parents[2] / "baselines" / "kda"
SCAN_SOURCE = (KDA / "scan_kernel.py").read_text()


def shp(B=1, T=256, H=2, D=32, state=0):
    return Shape(f"B{B} T{T} H{H} D{D} s{state}", {"B": B, "T": T, "H": H, "D": D, "state": state})


# --- the algebra, in fp64 --------------------------------------------------------------------------------


@pytest.mark.parametrize("dist", P.distributions)
@pytest.mark.parametrize("T,state,segments", [(256, 1, 4), (300, 0, 3), (37, 1, 5), (64, 0, 1)])
def test_reference_scan_is_the_recurrence(dist, T, state, segments):
    """o, the final state and the state entering every chunk, by the three phases, equal the token-by-token
    recurrence to fp64 rounding (uneven and single segments, a tail chunk, with and without h0)."""
    x = P.make_inputs(shp(B=2, T=T, H=2, D=16, state=state), dist, seed=T, device="cpu", cpu=True)
    got = sr.segmented_scan(x, torch.float64, chunk=32, segments=segments)
    o, s = oracle.recurrent_fp64(x)
    assert rel_rms(o, got["o"]) < 1e-12 and rel_rms(s, got["final_state"]) < 1e-12
    NT = got["chunk_starts"].shape[2]
    for n in sorted({1, NT // 2, NT - 1} - {0}):  # the state entering chunk n: the recurrence over n*C tokens
        head = {k: (t[:, : n * 32] if k != "initial_state" else t) for k, t in x.items()}
        _, s_n = oracle.recurrent_fp64(head)
        assert rel_rms(s_n, got["chunk_starts"][:, :, n]) < 1e-12, n
    bounds = sr.segment_bounds(NT, segments)
    starts = got["segment_starts"]
    assert starts.shape[2] == len(bounds)
    for i, (n0, _) in enumerate(bounds):
        assert torch.equal(starts[:, :, i], got["chunk_starts"][:, :, n0])
    assert o.abs().max() > 1e-3


@pytest.mark.parametrize("dist", P.distributions)
def test_chunk_transition_is_the_product_of_token_transitions(dist):
    """A_n = diag(gl) - kg^T w and B_n = kg^T u, the kernel's operands, are the chunk's token steps
    S <- (I - beta_t k_t k_t^T) diag(e^{g_t}) S + beta_t k_t v_t^T composed over its 32 tokens."""
    x = P.make_inputs(shp(B=1, T=64, H=1, D=16), dist, seed=9, device="cpu", cpu=True)
    A, Bm = sr.transitions(sr.chunk_operands(x, torch.float64, chunk=32))
    k, v, g = (x[n][0, :, 0].double() for n in ("k", "v", "g"))
    beta = x["beta"][0, :, 0].double()
    eye = torch.eye(16, dtype=torch.float64)
    for n in range(2):
        M, N = eye.clone(), torch.zeros(16, 16, dtype=torch.float64)
        for t in range(32 * n, 32 * n + 32):
            step = (eye - beta[t] * torch.outer(k[t], k[t])) @ torch.diag(g[t].exp())
            M, N = step @ M, step @ N + beta[t] * torch.outer(k[t], v[t])
        scale = max(M.abs().max().item(), 1e-300)
        assert (A[0, 0, n] - M).abs().max() / scale < 1e-12
        assert torch.allclose(Bm[0, 0, n], N, atol=1e-12, rtol=0)
        assert torch.linalg.matrix_norm(A[0, 0, n], ord=2) <= 1 + 1e-12  # a contraction: the walk is stable


def test_reference_scan_in_fp32_is_within_fp32_rounding():
    x = P.make_inputs(shp(B=1, T=300, H=2, D=16, state=1), "strong", seed=2, device="cpu", cpu=True)
    ref = P.oracle(x)
    got = sr.segmented_scan(x, torch.float32, chunk=32, segments=4)
    assert got["o"].dtype == torch.float32
    assert rel_rms(ref["o"], got["o"]) < 1e-5 and rel_rms(ref["final_state"], got["final_state"]) < 1e-5


def test_segment_bounds():
    assert sr.segment_bounds(256, 16) == [(16 * i, 16 * i + 16) for i in range(16)]
    assert sr.segment_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert sr.segment_bounds(2, 5) == [(0, 1), (1, 2)]
    assert sr.segment_bounds(7, 1) == [(0, 7)]


def test_scan_flops_at_the_primary_shape():
    """B1 T8192 H32 D128, 32-row chunks, 16 segments: the state pass 27.8 GFLOP (6 C K V + 2 C^2 V per
    chunk), the composition 15 segments x 16 chunks x 4 C K (K + V), less M_0 without h0: 31.1 GFLOP."""
    f = sr.scan_flops(1, 8192, 32, 128, 128, chunk=32, segments=16, initial_state=False)
    assert f["segments"] == 16 and f["chunks_per_segment"] == 16
    assert f["state_pass"] == 32 * 256 * (6 * 32 * 128 * 128 + 2 * 32 * 32 * 128) == pytest.approx(2.7917e10, rel=1e-4)
    assert f["compose"] == 32 * 4 * 32 * 128 * (15 * 16 * 256 - 16 * 128) == pytest.approx(3.1139e10, rel=1e-4)
    assert f["walk"] == 32 * 15 * 2 * 128 ** 3
    with_h0 = sr.scan_flops(1, 8192, 32, 128, 128, chunk=32, segments=16, initial_state=True)
    assert with_h0["compose"] == 32 * 4 * 32 * 128 * 15 * 16 * 256
    # one segment: nothing to compose or walk
    one = sr.scan_flops(1, 8192, 32, 128, 128, chunk=32, segments=1, initial_state=True)
    assert one["compose"] == 0 and one["walk"] == 0


# --- the candidate module --------------------------------------------------------------------------------


def test_candidate_passes_the_rules_and_is_a_starting_kernel():
    assert check_source(SCAN_SOURCE, "kda").ok, check_source(SCAN_SOURCE, "kda")
    knobs, space = start_kernel_knobs(SCAN_SOURCE)
    assert knobs["SEGMENTS"] in space["SEGMENTS"] and knobs["CHUNK"] == 32


def test_prep_is_the_starting_kernels_verbatim():
    """The prep launch and its helpers are the starting kernel's, character for character: the scan changes
    only the state pass, and the two files cannot drift apart unseen."""
    def functions(source):
        tree = ast.parse(source)
        return {n.name: ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.FunctionDef)}

    start, scan = functions((KDA / "kernel.py").read_text()), functions(SCAN_SOURCE)
    for name in ("_level", "_double", "_a_block", "_solve", "_kda_prep"):
        assert scan[name] == start[name], name


def load(knobs: dict, tmp_path, source: str = SCAN_SOURCE):
    """The template rendered with `knobs` into a file and imported (Triton's JIT wants a source file)."""
    path = tmp_path / f"scan_{abs(hash(repr(sorted(knobs.items()))))}.py"
    path.write_text(render(source, knobs))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(mod, shape, x):
    out = {n: torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype))
           for n, s in P.output_specs(shape, cpu=True).items()}
    with np.errstate(all="ignore"):  # the prep's discarded upper-triangle entries may overflow in a product
        bufs = mod.forward(x, out)
    return out, bufs


# (knobs, shape): several segments with a state, uneven segments and a tail chunk without one (M_0 skipped),
# two chunks in two segments, more segments asked than chunks, column blocks narrower than K, other chunk
# sizes, one segment (no composition), the split prep path, the walk in exact fp32
CASES = [
    ({"SEGMENTS": 4}, shp(B=1, T=256, H=2, D=32, state=1)),
    ({"SEGMENTS": 3, "BW": 16, "BV": 16}, shp(B=2, T=300, H=1, D=16, state=0)),
    ({"SEGMENTS": 8}, shp(B=1, T=37, H=2, D=16, state=1)),
    ({"SEGMENTS": 4, "BW": 16, "SCAN_PREC": "ieee", "FAST": False}, shp(B=1, T=256, H=1, D=32, state=1)),
    ({"SEGMENTS": 3, "CHUNK": 16, "BV": 16}, shp(B=1, T=200, H=1, D=16, state=1)),
    ({"SEGMENTS": 2, "CHUNK": 64, "BD": 8, "BK": 16}, shp(B=1, T=256, H=1, D=32, state=0)),
    ({"SEGMENTS": 1}, shp(B=1, T=100, H=1, D=16, state=1)),
]


@pytest.mark.parametrize("knobs,shape", CASES, ids=[s.name + " " + repr(k) for k, s in CASES])
@pytest.mark.parametrize("dist", P.distributions)
def test_kernel_interpreter_matches_the_oracle(knobs, shape, dist, tmp_path):
    """fp32 under the interpreter: the outputs within 1e-5 of the fp64 oracle (far under the 2e-3 floor), and
    every segment's start state, written by the compose and walk launches, is the reference's."""
    mod = load(knobs, tmp_path)
    x = P.make_inputs(shape, dist, seed=shape["T"], device="cpu", cpu=True)
    out, bufs = run(mod, shape, x)
    ref = P.oracle(x)
    for n in P.compared_outputs(shape):
        err = rel_rms(ref[n], out[n])
        assert err < 1e-5, (n, err)
    C = mod.KNOBS["CHUNK"]
    want = sr.segmented_scan(x, torch.float64, chunk=C, segments=mod.KNOBS["SEGMENTS"])["segment_starts"]
    assert bufs["segment_starts"].shape == want.shape
    assert rel_rms(want, bufs["segment_starts"]) < 1e-5
    if want.shape[2] > 1:
        assert bufs["segment_starts"][:, :, 1:].abs().max() > 1e-3  # the walk carried a state, not zeros


@pytest.mark.parametrize("dist", P.distributions)
def test_kernel_interpreter_agrees_with_the_starting_kernel(dist, tmp_path):
    """Same prep, the state pass regrouped: the two kernels agree to fp32 rounding at the CPU shape too."""
    x = P.make_inputs(P.cpu_shape, dist, seed=2, device="cpu", cpu=True)
    scan, _ = run(load({"SEGMENTS": 2}, tmp_path), P.cpu_shape, x)
    start = load({}, tmp_path, (KDA / "kernel.py").read_text())
    base = {n: torch.full(s.shape, float("nan")) for n, s in P.output_specs(P.cpu_shape, cpu=True).items()}
    with np.errstate(all="ignore"):
        start.run(x, base)
    for n in P.compared_outputs(P.cpu_shape):
        assert rel_rms(base[n], scan[n]) < 1e-5, n


@pytest.mark.parametrize("kind", ["steep", "bursts"])
def test_kernel_interpreter_extreme_gates(kind, tmp_path):
    """Single steps past -150 nats and -100 nat bursts: finite, and as accurate as the starting kernel's
    bounds for the same gates (tests/baselines/test_kda.py: the prep's clamp, fp32's cumsum)."""
    sh = shp(B=1, T=160, H=1, D=32, state=1)
    x = P.make_inputs(sh, "mild", seed=4, device="cpu", cpu=True)
    x["g"] = extreme_gates(kind, sh, seed=5).contiguous()
    out, _ = run(load({"SEGMENTS": 3}, tmp_path), sh, x)
    ref = P.oracle(x)
    for n in P.compared_outputs(sh):
        assert torch.isfinite(out[n]).all(), n
        assert rel_rms(ref[n], out[n]) < 1e-4, n


def test_invalid_knobs_raise(tmp_path):
    x = P.make_inputs(P.cpu_shape, "mild", seed=0, device="cpu", cpu=True)
    for knobs in ({"BOUND": 1e9}, {"BD": 4}):
        with pytest.raises(ValueError):
            run(load(knobs, tmp_path), P.cpu_shape, x)


def test_step_rounds_at_the_primary_shape():
    """The latency model with ptxas' 2 programs per SM for both launches (BV 32, BW 64 at 4 warps) against
    the serial pass's 256 rounds (128 programs, one wave): at 16 segments the re-walk's 2,048 programs
    and the compose's (15 x 4 - 2) x 32 take 8 waves of 16 steps each, plus 15 walk steps: no gain. At 4
    programs per SM and 4 segments, each launch is one wave of 64 steps: 131 rounds, about half."""
    r = sr.step_rounds(1, 8192, 32, 128, chunk=32, segments=16, bv=32, bw=64, K=128, slots_state=264,
                       slots_compose=264)
    assert r == {"serial": 256, "scan_state": 8 * 16, "compose": 8 * 16, "walk": 15}
    r = sr.step_rounds(1, 8192, 32, 128, chunk=32, segments=4, bv=32, bw=64, K=128, slots_state=528,
                       slots_compose=528)
    assert r == {"serial": 256, "scan_state": 64, "compose": 64, "walk": 3}  # 320 composing programs: one wave


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_gpu_primary_shape(tmp_path):
    """Compiled on the device (a process of its own, the interpreter off): the defaults pass the harness's
    tolerance against the fp64 oracle on every distribution at the primary shape; the times are printed."""
    import json
    import subprocess
    import sys

    out = tmp_path / "rows.jsonl"
    p = subprocess.run([sys.executable, "scripts/time_knobs.py", "kda", "--template", str(KDA / "scan_kernel.py"),
                        "--out", str(out)], capture_output=True, text=True, timeout=1200,
                       cwd=KDA.parents[1], env={**os.environ, "TRITON_INTERPRET": "0"})
    print(p.stdout[-3000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert {r["dist"] for r in rows} == set(P.distributions) and all(r["ok"] for r in rows)
