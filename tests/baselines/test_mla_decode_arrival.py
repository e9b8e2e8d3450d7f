"""The arrival-combine mla_decode design (baselines/mla_decode/arrival_kernel.py) under the Triton
interpreter (fp32) against the fp64 oracle on every distribution, its arrival counters across repeated
launches, its launch plan, and the candidate rules. Under the interpreter the last arrival of each group
combines it alone (COMBINERS 1); the several-combiner wait runs only on the GPU (the `gpu`-marked test: the
primary shapes, launched eagerly and replayed as a CUDA graph, in a process of its own since this module
interprets)."""

from __future__ import annotations

import os

# the kernel runs under the Triton interpreter here; set before anything imports triton
os.environ["TRITON_INTERPRET"] = "1"

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from baselines.mla_decode.spec import PROBLEM as P
from baselines.problem import Shape, rel_rms, render, start_kernel_knobs
from rules.check import check_source

MLA = Path(__file__).resolve().parents[2] / "baselines" / "mla_decode"
SOURCE = (MLA / "arrival_kernel.py").read_text()


def load(knobs: dict, tmp_path):
    """The template rendered with `knobs` into a file and imported (Triton's JIT wants a source file)."""
    path = tmp_path / f"arrival_{abs(hash(repr(sorted(knobs.items()))))}.py"
    path.write_text(render(SOURCE, knobs))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def decode(mod, shape, dist, seed=0):
    x = P.make_inputs(shape, dist, seed=seed, device="cpu", cpu=True)
    out = {n: torch.full(s.shape, float("nan")) for n, s in P.output_specs(shape, cpu=True).items()}
    mod.run(x, out)
    return x, out


def shp(Q, H, S, DL=128, DR=16):
    return Shape(f"Q{Q} H{H} S{S} DL{DL} DR{DR}", {"Q": Q, "H": H, "S": S, "DL": DL, "DR": DR})


# (knobs, shape): the defaults on the cpu_shape (2 dv halves x 4 splits, the last masked); 7 splits of one
# 16-key tile (the last of 4 keys) combined 2 per step (4 steps, the running max carried); one split; whole
# tiles (the unmasked loop) in two row blocks; a partly masked row block (M = 24 < 32); the primary shapes'
# widths and heads with a short cache at Q1 and Q4 (64-row blocks, 256-column halves)
CASES = [
    ({}, P.cpu_shape),
    ({"SPLIT_DV": 1, "BLOCK_N": 16, "GRID": 8, "COMBINE_TILE": 256}, P.cpu_shape),
    ({"GRID": 1, "BLOCK_N": 64}, P.cpu_shape),
    ({"BLOCK_H": 16, "BLOCK_N": 32, "GRID": 16}, shp(2, 16, 128)),
    ({"BLOCK_H": 32, "BLOCK_N": 16, "GRID": 8, "SPLIT_DV": 1}, shp(3, 8, 128)),
    ({"BLOCK_N": 64}, shp(1, 64, 192, 512, 64)),
    ({"BLOCK_N": 32, "GRID": 16}, shp(4, 64, 100, 512, 64)),
]


@pytest.mark.parametrize("knobs,shape", CASES, ids=[s.name + " " + json.dumps(k) for k, s in CASES])
@pytest.mark.parametrize("dist", P.distributions)
def test_interpreter_matches_the_oracle(knobs, shape, dist, tmp_path):
    """fp32 under the interpreter: within 1e-5 of the fp64 oracle (far under the 1e-4 floor), every element
    written (the outputs start as NaN)."""
    if shape["DL"] == 512 and dist != "peaked":
        pytest.skip("the primary widths once, on the distribution with the largest logits")
    mod = load(knobs, tmp_path)
    x, out = decode(mod, shape, dist)
    assert not out["o"].isnan().any()
    err = rel_rms(P.oracle(x)["o"], out["o"])
    assert err < 1e-5, err


def test_counters_count_launches_and_repeat_bit_for_bit(tmp_path):
    """Each group's counter grows by its split count per launch (nothing to reset between CUDA graph
    replays), and a second launch gives the same bits."""
    mod = load({"BLOCK_N": 16, "GRID": 16}, tmp_path)
    x, first = decode(mod, P.cpu_shape, "unit", seed=3)
    again = {"o": torch.full_like(first["o"], float("nan"))}
    mod.run(x, again)
    assert torch.equal(first["o"], again["o"])
    (po, plse, cnt), = mod._SCRATCH.values()
    splits = plse.numel() // (2 * 8)  # SPLIT_DV 2, M = Q*H = 8 rows
    assert splits == 7  # 100 keys in 16-key splits (GRID 16 over 2 groups caps at the 7 tiles)
    assert cnt.tolist() == [2 * splits, 2 * splits]


def test_launch_plan_at_the_primary_shapes(tmp_path):
    """On an H200 (132 SMs) the defaults give Q1 64 splits x 2 dv halves with 32 combiners of 2 rows per
    half, Q4 16 splits x 8 groups (4 row blocks x 2 halves) with 16 combiners of 4 rows; the interpreter one
    combiner (no wait)."""
    mod = load({}, tmp_path)
    assert mod.launch_plan(64, 8192, 512, 132) == {"BLOCK_H": 64, "groups": 2, "split_len": 128, "splits": 64,
                                                   "COMBINERS": 32, "RED_S": 32}
    assert mod.launch_plan(256, 8192, 512, 132) == {"BLOCK_H": 64, "groups": 8, "split_len": 512, "splits": 16,
                                                    "COMBINERS": 16, "RED_S": 16}
    assert mod.launch_plan(64, 8192, 512, 0)["COMBINERS"] == 1


@pytest.mark.parametrize("M", [8, 64, 256])
def test_launch_plan_never_lets_waiting_combiners_fill_the_gpu(M, tmp_path):
    """For every setting of the settings file and every COMBINERS value: waiting combiners (COMBINERS > 1 per
    group; a lone one never waits) leave an SM free, each combines a whole power-of-two share of its block's rows, and
    the splits cover the cache in whole tiles."""
    settings = [json.loads(line) for line in (MLA / "arrival_settings.jsonl").read_text().splitlines() if line]
    _, space = start_kernel_knobs(SOURCE)
    for s in settings:
        for c in space["COMBINERS"]:
            knobs = {**s, "COMBINERS": c}
            mod = load(knobs, tmp_path)
            for sms in (78, 132):
                plan = mod.launch_plan(M, 8192, 512, sms)
                n = plan["COMBINERS"]
                assert n == 1 or n * plan["groups"] < sms, (knobs, plan)  # a lone combiner never waits
                assert n & (n - 1) == 0 and plan["BLOCK_H"] % n == 0, (knobs, plan)
                assert n <= plan["splits"] and plan["split_len"] % mod.KNOBS["BLOCK_N"] == 0
                assert (plan["splits"] - 1) * plan["split_len"] < 8192 <= plan["splits"] * plan["split_len"]


def test_candidate_passes_the_rules_and_is_a_starting_kernel():
    report = check_source(SOURCE, "mla_decode")
    assert report.ok, report
    knobs, space = start_kernel_knobs(SOURCE)
    assert all(knobs[k] in v for k, v in space.items())


def test_settings_file_names_only_template_knobs():
    settings = [json.loads(line) for line in (MLA / "arrival_settings.jsonl").read_text().splitlines() if line]
    knobs, _ = start_kernel_knobs(SOURCE)
    assert 5 <= len(settings) <= 12
    for s in settings:
        assert set(s) <= set(knobs), s
        render(SOURCE, s)


GPU_CHILD = textwrap.dedent(
    """
    import importlib.util, json, sys, tempfile
    sys.path.insert(0, sys.argv[1])
    import torch
    from baselines.mla_decode.spec import PROBLEM as P
    from baselines.problem import rel_rms, render
    path = tempfile.mkdtemp() + "/arrival_gpu.py"
    with open(path, "w") as f:
        f.write(render(open(sys.argv[2]).read(), json.loads(sys.argv[3])))
    spec = importlib.util.spec_from_file_location("arrival_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = []
    for shape in P.shapes:
        for dist in P.distributions:
            x = P.make_inputs(shape, dist, 0, "cuda")
            out = {"o": torch.full(P.output_specs(shape)["o"].shape, float("nan"), dtype=torch.bfloat16,
                                   device="cuda")}
            mod.run(x, out)
            torch.cuda.synchronize()
            first = out["o"].clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                mod.run(x, out)
            same = True
            for _ in range(5):  # replays: the counters carry on from the eager launch and the capture
                out["o"].fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                same = same and torch.equal(out["o"], first)
            ref = P.oracle(x)["o"]
            tol = max(P.tolerance_floor, P.tolerance_alpha * rel_rms(ref, P.baselines()["torch-bmm"](x)["o"]))
            rows.append({"shape": shape.name, "dist": dist, "err": rel_rms(ref, first), "tol": tol, "same": same})
    print(json.dumps(rows))
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [{}, {"COMBINERS": 64}, {"BLOCK_N": 16, "num_stages": 2, "GRID": 256}])
def test_gpu_primary_shapes_eager_and_graph_replays(knobs):
    """Compiled, the several-combiner wait included: within the harness's tolerance on every distribution at
    Q1 and Q4, and five CUDA graph replays bit for bit the eager launch (no counter reset between them)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    p = subprocess.run([sys.executable, "-c", GPU_CHILD, str(root), str(MLA / "arrival_kernel.py"), json.dumps(knobs)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(rows) == len(P.shapes) * len(P.distributions)
    for r in rows:
        assert r["err"] <= r["tol"] and r["same"], r
