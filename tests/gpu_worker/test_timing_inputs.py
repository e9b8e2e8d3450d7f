"""Every timed call runs on values never met before (gpu_worker.timing_inputs): the real benchmark loop
(BenchmarkStage.interleave, with the children's Servers in this process) is recorded refill by refill, for every
built-in problem and a KernelBench file. Within each side no input set, and no row of one, comes back, not
even as a permutation or roll (rows and sets compared as sorted values); the baseline's timed calls run on
exactly the candidate's values, and the fingerprints compare like with like. The device-side memo cheats
(tests/gpu_worker/kernels/memo_*.py) hit on rotated rows and heads and on repeated sets, never on these values."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpu_worker import child
from gpu_worker.child.timing import ChildTiming
from gpu_worker.wire import Reply
from gpu_worker.timing_inputs import FreshValues, check_entries, entry_seed
from tests.gpu_worker.harnesses import KERNELS, req

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "tests" / "baselines" / "files"


class InProcess:
    """A child's Server called the way the worker calls a Sandbox."""

    def __init__(self, server):
        self.s = server

    def call(self, request, timeout, hb=None):
        return Reply(seq=None, result=child.serve(self.s, request))


def _server(tmp_path, name: str, role: str, problem: str):
    d = tmp_path / name
    d.mkdir()
    s = child.Server(str(d), role)
    if role == "reference":
        s.cmd_setup(problem, None)
    else:  # the candidate: the baseline's answers, written into the harness's outputs
        s.core._setup_problem(problem, None)
        base = next(iter(s.core.problem.baselines().values()))
        s.timing._fn = lambda: (lambda inputs, out: [out[k].copy_(v) for k, v in base(inputs).items() if k in out])
    s.seen = s.timing.seen = []  # ((entry, key), the static inputs after the refill)
    return s


def _record(monkeypatch):
    original = ChildTiming._before_rep

    def before_rep(self, ts, r, e, key, graph=False):
        original(self, ts, r, e, key, graph)
        held = ts.sets[r][0]
        self.seen.append(((e, key), {k: v.clone() for k, v in held.items() if isinstance(v, torch.Tensor)}))

    monkeypatch.setattr(ChildTiming, "_before_rep", before_rep)


def _digests(values: dict) -> list[bytes]:
    """A set's float tensors and each of their rows (the last axis), each as its sorted values: equal for
    a permutation or roll of the same contents."""
    out = []
    for k in sorted(values):
        v = values[k]
        if not v.is_floating_point():
            continue
        out.append(hashlib.sha256(k.encode() + torch.sort(v.reshape(-1)).values.numpy().tobytes()).digest())
        rows = torch.sort(v.reshape(-1, v.shape[-1]), dim=-1).values
        out += [hashlib.sha256(k.encode() + b"row" + r.numpy().tobytes()).digest() for r in rows]
    return out


def _problem_key(store_root: Path) -> str:
    from workflows.artifacts import ArtifactStore

    return "file:" + ArtifactStore(store_root).put_bytes((FILES / "layernorm.py").read_bytes())


@pytest.mark.parametrize("name", ["softmax", "kda", "mla_decode", "mla_prefill", "layernorm-file"])
def test_no_repetition_of_a_benchmark_meets_values_seen_before(name, tmp_path, monkeypatch):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    monkeypatch.setenv("MARATHON_ARTIFACTS", str(tmp_path / "art"))
    problem = _problem_key(tmp_path / "art") if name == "layernorm-file" else name
    _record(monkeypatch)
    ev = Evaluator(store=ArtifactStore(tmp_path / "art"), interpreter=True, scheduler=Scheduler(spares=0))
    try:
        cand, ref, best = (_server(tmp_path, n, role, problem)
                           for n, role in (("cand", "candidate"), ("ref", "reference"), ("best", "candidate")))
        p = ref.core.problem
        dist = p.distributions[-1]
        plan = {"blocks": 3, "reps": 4, "warmup": 2, "rotate": 2, "pool": 2, "host_reps": 2}
        for s in (cand, ref, best):
            s.cmd_prepare(rotate=2, pool=2, dist=dist, seed=ev.timing_seed)
        res = ev.bench_stage.interleave(p, dist, InProcess(cand), InProcess(ref), InProcess(best), plan, None)
        cand.cmd_profile(reps=2, dist=dist)  # the cross-check's refills: values of their own too
        assert len(res.checks) == len(res.base_checks) == 3 * 4
        assert "12 timed calls fingerprinted, worst 0 of" in ev.timed_outputs.check_fingerprints(p, ref.core.shape, dist, res)
    finally:
        ev.close()
    # within each side (the candidate's profile included) no set and no row comes back, in any order, and
    # none is a pool set (what the buffers held when captured)
    for s in (cand, ref, best):
        digests = [d for values in s.timing.timing_sets[dist].pool for d in _digests(values)]
        digests += [d for _, values in s.seen for d in _digests(values)]
        assert len(s.seen) >= 3 * 4 + 2 and len(set(digests)) == len(digests), s.core.tmp
    # the baseline's timed calls ran on the candidate's very values: the keys its child drew, which no
    # other repetition of the benchmark shares
    mine = dict(cand.seen)
    shared = [e for e, _ in ref.seen if e in mine]
    assert sorted(e for e, _ in shared) == sorted(c[0] for c in res.checks)
    for e, values in ref.seen:
        if e in mine:
            assert all(torch.equal(values[k], mine[e][k]) for k in values), e
    keys = [k for s in (cand, ref, best) for (_, k), _ in s.seen]
    assert len(set(keys)) == len(keys) - len(shared)


def test_an_entry_s_values_are_the_same_in_another_process_and_differ_between_entries(tmp_path):
    """The reference child derives the candidate child's values from (noise seed, entry) alone."""
    from baselines.registry import get_problem

    p = get_problem("kda")
    pool = [p.make_inputs(p.cpu_shape, "strong", seed=s, device="cpu", cpu=True) for s in (1, 2)]
    fresh = FreshValues(p.perturbed, "strong", "cpu", torch.Generator)
    here = {e: fresh(pool, e, entry_seed(77, e)) for e in (0, 1, 5)}
    code = ("import sys, torch\nfrom baselines.registry import get_problem\n"
            "from gpu_worker.timing_inputs import FreshValues, entry_seed\n"
            "p = get_problem('kda')\n"
            "pool = [p.make_inputs(p.cpu_shape, 'strong', seed=s, device='cpu', cpu=True) for s in (1, 2)]\n"
            "torch.save(FreshValues(p.perturbed, 'strong', 'cpu', torch.Generator)(pool, 5, entry_seed(77, 5)), "
            "sys.argv[1])\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "v.pt")], capture_output=True, text=True,
                       timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    there = torch.load(tmp_path / "v.pt")
    assert all(torch.equal(here[5][k], there[k]) for k in there)
    assert not torch.equal(here[0]["q"], here[1]["q"]) and not torch.equal(here[1]["v"], here[5]["v"])
    assert not torch.equal(fresh(pool, 5, entry_seed(78, 5))["q"], here[5]["q"])  # another benchmark: other values
    assert entry_seed(1, 2) != entry_seed(2, 1) and entry_seed(1, 2) == entry_seed(1, 2)
    with pytest.raises(ValueError, match="distinct"):
        check_entries([3, 4, 3])


# --- the memo cheats ----------------------------------------------------------------------------------------

#: each memo kernel's problem, and a change of the inputs that leaves what the memo keys on
_OLD = {
    "memo_rows": ("softmax", "roll(x, 5, rows)"),
    "memo_mla_heads": ("mla_decode", "roll(q, 1, heads), roll(cache, 7, rows)"),
    "memo_sample": ("softmax", "the same set again"),
}

_PROBE = r"""
import importlib.util, json, sys, torch
from baselines.registry import get_problem
from baselines.problem import rel_rms
from gpu_worker.timing_inputs import FreshValues, entry_seed
name, problem = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location(name, sys.argv[3])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
p = get_problem(problem); dist = p.distributions[-1]
pool = [p.make_inputs(p.cpu_shape, dist, seed=s, device="cpu", cpu=True) for s in (1, 2)]
def keep_key(x):
    if name == "memo_rows":
        return {"x": torch.roll(x["x"], 5, dims=0)}
    if name == "memo_mla_heads":
        return {"q": torch.roll(x["q"], 1, dims=1), "kv_cache": torch.roll(x["kv_cache"], 7, dims=0)}
    return x
def call(x):
    out = {k: torch.full(s.shape, float("nan")) for k, s in p.output_specs(p.cpu_shape, cpu=True).items()}
    m.run(x, out)
    ref = p.oracle(x)
    return max(rel_rms(ref[k], out[k]) for k in ref)
def hits():
    return int(next(iter(m.STATE.values()))["hits"][0])
errs = [call(x) for x in pool]
errs += [call(keep_key(x)) for x in pool]
invariant_hits = hits()
fresh = FreshValues(p.perturbed, dist, "cpu", torch.Generator)
errs += [call(fresh(pool, e, entry_seed(4242, e))) for e in range(12)]
print(json.dumps({"invariant_hits": invariant_hits, "new_hits": hits() - invariant_hits, "worst_err": max(errs)}))
"""


@pytest.mark.parametrize("name", sorted(_OLD))
def test_a_memo_hits_on_rotations_and_repeats_and_never_on_fresh_values(name):
    """The cheats are real: on rotated rows and heads, or a set again, the rows or calls hit and the copied
    answers are right; on entries' values none does."""
    problem, how = _OLD[name]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", _PROBE, name, problem, str(KERNELS / f"{name}.py")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["invariant_hits"] > 0, (how, got)
    assert got["new_hits"] == 0, got
    assert got["worst_err"] < 1e-5, got  # right when it hits: nothing but fresh values catches it


def _memo_source(name: str, memo: bool) -> str:
    src = (KERNELS / f"{name}.py").read_text()
    return src if memo else src.replace("MEMO = True", "MEMO = False")


@pytest.mark.parametrize("name, problem", [("memo_rows", "softmax"), ("memo_mla_heads", "mla_decode"),
                                           ("memo_sample", "softmax"), ("memo_rows", "softmax-file")])
def test_a_memo_gains_nothing_in_a_real_benchmark(judge, store, name, problem):
    """Judged for real: the memo is rejected (timed-output: an answer copied for other values) or it passes,
    on a GPU no faster than its honest twin (its speedup interval not wholly above the twin's). A candidate
    cannot tell the harness its hits (a host read of its counter is refused): the refills above and the
    probe show there are none."""
    from workflows.contracts import BenchRequest

    if problem == "softmax-file":
        problem = "file:" + store.put_bytes((FILES / "softmax.py").read_bytes())

    def bench(memo: bool):
        r = req(store, _memo_source(name, memo), problem)
        assert judge.compile(r).ok
        return judge.benchmark(BenchRequest(problem=problem, candidate_id=r.candidate_id, source_key=r.source_key))

    b = bench(True)
    if not b.ok:
        assert b.stage == "benchmark" and b.reason.startswith("timed-output"), b.reason
        return
    if not judge.interpreter:  # (the interpreter's times say nothing; its hits are the probe's to count)
        honest = bench(False)
        assert honest.ok, honest.reason
        assert b.speedup_ci[0] <= honest.speedup_ci[1], (b.speedup_ci, honest.speedup_ci)
