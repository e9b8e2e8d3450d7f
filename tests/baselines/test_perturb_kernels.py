"""The GPU's one-pass perturbation kernels (baselines.perturb_kernels) follow the torch forms' laws: run
under Triton's interpreter (fp32, on the CPU) in a process of their own, their draws are standard normal
and independent, each mode's result has the torch form's range and moments, a seed gives the same values
again and another seed others, a tail block is written to its last element, and the source is left as
it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, math
import torch
import torch.nn.functional as F
from baselines import perturb_kernels as pk
from baselines.perturb import MIX

def run(mode, src, seed, a=0.0, b=0.0):
    out = torch.full_like(src, float("nan"))
    pk.elementwise(src, out, seed, mode, a, b)
    return out

n = 5000  # not a multiple of BLOCK: the tail block's mask
x = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 3.0
pristine = x.clone()
z = run(pk.MIX, x, 11, 1.0, 0.0)  # the draws themselves
r = {"z_mean": float(z.mean()), "z_std": float(z.std()),
     "z_lag1": float(torch.corrcoef(torch.stack([z[:-1], z[1:]]))[0, 1]),
     "z_finite": bool(torch.isfinite(z).all()),
     "same_seed": bool(torch.equal(z, run(pk.MIX, x, 11, 1.0, 0.0))),
     "other_seed_corr": float(torch.corrcoef(torch.stack([z, run(pk.MIX, x, 12, 1.0, 0.0)]))[0, 1]),
     "big_seed_ok": bool(torch.isfinite(run(pk.MIX, x, (1 << 62) + 5, 1.0, 0.0)).all())}
m = run(pk.MIX, x, 13, MIX * 3.0, MIX)
r["mix_std"] = float(m.std())
r["mix_corr"] = float(torch.corrcoef(torch.stack([m, x]))[0, 1])
pos = x.abs() + 0.1
rel = run(pk.RELATIVE, pos, 14, 0.25)
r["rel_positive"] = bool((rel > 0).all())
r["rel_log_std"] = float((rel / pos).log().std())
r["rel_ratio_mean"] = float((rel / pos).mean())
for shift, div in ((3.0, 1.0), (0.0, 0.1)):
    g = run(pk.LOGSIGMOID, x, 15, shift, 1.0 / div)
    torch_form = F.logsigmoid(torch.randn(200000, generator=torch.Generator().manual_seed(1)) + shift) / div
    r[f"ls_{shift}_max"] = float(g.max())
    r[f"ls_{shift}_mean"] = float(g.mean())
    r[f"ls_{shift}_torch_mean"] = float(torch_form.mean())
    r[f"ls_{shift}_torch_std"] = float(torch_form.std())
    r[f"ls_{shift}_std"] = float(g.std())
s = run(pk.SIGMOID, x, 16)
r["sig_min"], r["sig_max"], r["sig_mean"] = float(s.min()), float(s.max()), float(s.mean())
rows_src = F.normalize(torch.randn(300, 32, generator=torch.Generator().manual_seed(2)), dim=-1)
rows_out = torch.full_like(rows_src, float("nan"))
pk.rows(rows_src, rows_out, 17, 1 / math.sqrt(32))
r["rows_norm_err"] = float((rows_out.norm(dim=-1) - 1).abs().max())
r["rows_cos"] = float((rows_out * rows_src).sum(-1).mean())
r["src_kept"] = bool(torch.equal(x, pristine))
print(json.dumps(r))
"""


@pytest.fixture(scope="module")
def laws() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_draws_are_standard_normal_independent_and_seeded(laws):
    assert laws["z_finite"] and laws["big_seed_ok"]
    assert abs(laws["z_mean"]) < 0.05 and 0.95 < laws["z_std"] < 1.05
    assert abs(laws["z_lag1"]) < 0.05  # neighbouring elements draw independently
    assert laws["same_seed"]
    assert abs(laws["other_seed_corr"]) < 0.05


def test_each_mode_keeps_the_torch_form_s_law(laws):
    # mixed: N(0, 3^2) again, correlated MIX with its source
    assert 2.8 < laws["mix_std"] < 3.2 and 0.65 < laws["mix_corr"] < 0.76
    # relative noise: positive stays positive, log-ratio std 0.25, mean ratio 1
    assert laws["rel_positive"] and 0.23 < laws["rel_log_std"] < 0.27 and 0.98 < laws["rel_ratio_mean"] < 1.02
    for shift in (3.0, 0.0):  # KDA's decay laws, mild and strong: never above 0, the torch form's moments
        assert laws[f"ls_{shift}_max"] <= 0.0
        mean, tmean, tstd = laws[f"ls_{shift}_mean"], laws[f"ls_{shift}_torch_mean"], laws[f"ls_{shift}_torch_std"]
        assert abs(mean - tmean) < 4 * tstd / 5000 ** 0.5, (shift, mean, tmean)
        assert 0.9 < laws[f"ls_{shift}_std"] / tstd < 1.1
    assert 0.0 < laws["sig_min"] and laws["sig_max"] < 1.0 and abs(laws["sig_mean"] - 0.5) < 0.02


def test_rows_are_unit_vectors_moved_by_an_independent_one(laws):
    assert laws["rows_norm_err"] < 1e-5
    assert 0.64 < laws["rows_cos"] < 0.77  # a unit vector plus one of about unit length: cos ~ 1/sqrt(2)


def test_the_source_is_left_as_it_was(laws):
    assert laws["src_kept"]
