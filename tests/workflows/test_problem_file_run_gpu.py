"""The problem-file and problem-folder runs of test_problem_file_run.py on a GPU (marked `gpu`, skipped without
CUDA): `marathon start PATH`, the real workflow, the real agent worker and the real GPU activities with the
harness on the device (interpreter off, sandboxed children), then `marathon export` and the receipt's
`marathon verify`. Timings on a GPU are noisy: what is asserted is what the harness and the workflow
guarantee (a measured speedup, the receipt of the device it was measured on), never which setting is fastest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import shutil
import subprocess
import sys

import pytest

from activities.ledger import read_ledger
from tests.llm.script import TurnScript, turn
from tests.workflows.helpers import run_id
from tests.workflows.test_problem_file_run import FILES, folder_search_run, llm_file_run

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def cuda_gpu(store):
    """The real GPU activities, their harness on the GPU (sandboxed children, no interpreter)."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.worker import gpu_activities

    ev = Evaluator(store=store, interpreter=False, scheduler=Scheduler(spares=1))
    assert ev.cuda and not ev.interpreter
    yield gpu_activities(ev)
    ev.close()


def device_name() -> str:
    """The name torch gives device 0, asked in a child process (this one stays without a CUDA context)."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip(), p.stderr
    return p.stdout.strip()


def assert_measured(r) -> None:
    """A record (or best) measured on the device: positive times, its speedup their ratio."""
    assert not r.interpreter, r
    assert r.time_ms and r.time_ms > 0 and r.baseline_ms and r.baseline_ms > 0, r
    assert r.speedup is not None and r.speedup > 0, r
    assert r.speedup == pytest.approx(r.baseline_ms / r.time_ms, rel=1e-6), r


async def test_a_kernelbench_file_runs_end_to_end_on_the_gpu(env, store, cuda_gpu, tmp_path, monkeypatch):
    """The RMSNorm file at its get_inputs() size: the model's kernel crowned with a measured speedup, the
    wrong one rejected at verification; the export's receipt names the GPU and its re-verify passes there."""
    from gpu_worker.timing import BACK_TO_BACK, GRAPH

    from cli import main

    good = (FILES / "rmsnorm_kernel.py").read_text()
    wrong = good.replace("x * r * w", "x * r")  # the learned scale left out
    assert wrong != good
    script = TurnScript([turn(("submit_kernel", {"source": good, "rationale": "one program per row"})),
                         turn(("submit_kernel", {"source": wrong, "rationale": "no scale"}))])
    mine = tmp_path / "my_rmsnorm.py"
    shutil.copy(FILES / "rmsnorm.py", mine)
    key = "file:" + hashlib.sha256(mine.read_bytes()).hexdigest()
    address = env.client.service_client.config.target_host
    wid = run_id("file-gpu")
    _, res = await llm_file_run(env, cuda_gpu, monkeypatch, mine, script, 2, wid)
    assert res.problem == key and res.iterations == 2
    recs = read_ledger(store, res.ledger_key)
    assert [r.iteration for r in recs] == [1, 2]
    assert recs[0].outcome == "improved", recs[0]
    assert_measured(recs[0])
    assert recs[0].rel_err is not None and recs[0].log_key, recs[0]
    assert recs[1].outcome == "rejected" and recs[1].stage == "verify" and not recs[1].interpreter, recs[1]
    assert res.best is not None and res.best.candidate_id == recs[0].candidate_id
    assert_measured(res.best)
    assert res.best.speedup == recs[0].speedup
    assert res.best_source_key and store.get_text(res.best_source_key) == good

    # `marathon export`: what export_run writes for a GPU measurement
    out = tmp_path / "exported"
    assert await asyncio.to_thread(main, ["export", wid, "--out", str(out), "--address", address]) == 0
    receipt = json.loads((out / "receipt.json").read_text())
    assert receipt["run_id"] == wid and receipt["problem"] == {"key": key, "kind": "file",
                                                               "source_sha256": key.removeprefix("file:")}
    assert receipt["kernel"]["candidate_id"] == recs[0].candidate_id and receipt["kernel"]["iteration"] == 1
    assert receipt["kernel"]["source_sha256"] == hashlib.sha256(good.encode()).hexdigest()
    best = receipt["best"]
    assert best["interpreter"] is False
    assert best["speedup"] == recs[0].speedup and best["speedup"] > 0  # a GPU speedup is reported
    assert best["time_ms"] == recs[0].time_ms and best["baseline_ms"] == recs[0].baseline_ms
    assert best["speedup_ci"] == list(recs[0].speedup_ci) and len(best["speedup_ci"]) == 2
    assert best["deciding_distribution"] == recs[0].deciding_dist and best["deciding_distribution"]
    assert best["rel_err"] == recs[0].rel_err
    m = receipt["measured_on"]
    assert m is not None, "the benchmark log's receipt line was not found"
    name = device_name()
    assert m["device"] == name and "Triton interpreter" not in m["device"], m
    assert m["mode"] and m["mode"] != "interpreter", m
    assert set(m["mode"].split(", ")) <= {GRAPH, BACK_TO_BACK}, m  # the device-time modes of the judge
    assert m["torch"] == torch.__version__ and m["triton"], m
    assert isinstance(m["repetitions"], int) and m["repetitions"] > 0, m
    assert m["clocks"], m  # nvidia-smi's clocks, or why it could not be read
    md = (out / "receipt.md").read_text()
    assert "under the Triton interpreter" not in md
    assert f"- best: {best['speedup']:.3g}x" in md and f"vs baseline {best['baseline_ms']:.4g} ms" in md
    assert f"measured on: {name}," in md and f"mode {m['mode']}" in md
    cmd = receipt["verify_command"]
    assert cmd == f"marathon verify {out / 'problem.py'} {out / 'kernel.py'}" and cmd in md
    assert (out / "problem.py").read_bytes() == (FILES / "rmsnorm.py").read_bytes()
    text = (out / "kernel.py").read_text()
    assert good in text and "class ModelNew(" in text

    # the receipt's command, as a user runs it: the harness's verification on this GPU
    argv = shlex.split(cmd)
    v = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "cli"] + argv[1:],
                                capture_output=True, text=True, timeout=300)
    assert v.returncode == 0 and v.stdout.startswith("PASS: "), v.stdout + v.stderr
    assert "(GPU, shape get_inputs" in v.stdout, v.stdout  # verified on the device, at get_inputs()

    # ModelNew drops in for the problem's Model on the GPU, at get_inputs() size, with Model's weights
    check = ("import sys, torch, importlib.util as u\n"
             "s = u.spec_from_file_location('k', sys.argv[1]); m = u.module_from_spec(s); s.loader.exec_module(m)\n"
             "ref = m.marathon_reference\n"
             "torch.manual_seed(1); model = ref.Model(*ref.get_init_inputs()).cuda()\n"
             "torch.manual_seed(3); new = m.ModelNew(*ref.get_init_inputs()).cuda()\n"
             "new.load_state_dict(model.state_dict())\n"
             "torch.manual_seed(2); x = [t.cuda() for t in ref.get_inputs()]\n"
             "with torch.no_grad():\n"
             "    got, want = new(*x), model(*x)\n"
             "assert got.is_cuda and got.shape == want.shape, (got.device, got.shape, want.shape)\n"
             "torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5); print('same')\n")
    c = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", check, str(out / "kernel.py")],
                                capture_output=True, text=True, timeout=300)
    assert c.returncode == 0 and c.stdout.strip() == "same", c.stdout + c.stderr


async def test_marathon_start_folder_runs_the_search_policy_on_the_gpu(env, store, cuda_gpu, tmp_path):
    """The axpy folder under the search policy: every knob setting judged is correct and measured, the first
    is the template's own, and the run improves on it. The template starts at 64 elements and 8 warps a
    program, three quarters of its threads idle and too few loads in flight to reach the memory's bandwidth,
    so a setting the search reaches beats it by far more than the noise."""
    res = await folder_search_run(env, cuda_gpu, tmp_path, 6, run_id("folder-gpu"), 900)
    assert res.problem.startswith("folder:") and res.iterations == 6 and res.stopped_by == "budget-iterations", res
    recs = read_ledger(store, res.ledger_key)
    assert [r.iteration for r in recs] == [1, 2, 3, 4, 5, 6]
    assert all(r.outcome in ("improved", "passed") and r.knobs for r in recs), recs  # every setting is correct
    for r in recs:
        assert_measured(r)
    # the first judged is the template as written, its knobs the defaults of kernel.py's KNOBS line
    assert recs[0].knobs == {"BLOCK": 64, "num_warps": 8} and recs[0].outcome == "improved", recs[0]
    # the search proposes no candidate twice: six distinct knob settings of knobs.py's SPACE
    assert len({r.candidate_id for r in recs}) == 6
    settings = {tuple(sorted(r.knobs.items())) for r in recs}
    assert len(settings) == 6, settings
    space = {"BLOCK": [64, 128, 256, 512, 1024], "num_warps": [1, 2, 4, 8]}
    assert all(set(r.knobs) == set(space) and all(r.knobs[k] in space[k] for k in space) for r in recs), recs
    # after the first, each setting was timed head to head against the best of its moment, and a later
    # crown needed that interval above 1
    crowned = recs[0]
    for r in recs[1:]:
        assert r.vs_best == crowned.candidate_id and r.vs_best_ci is not None, (r, crowned.candidate_id)
        if r.outcome == "improved":
            assert r.vs_best_ci[0] > 1.0, r
            crowned = r
    # the result names that best, with its measured speedup against the baseline
    assert res.best is not None and res.best.candidate_id == crowned.candidate_id, (res.best, crowned)
    assert_measured(res.best)
    assert res.best.speedup == crowned.speedup and res.best.iteration == crowned.iteration
    assert res.best_source_key == crowned.source_key and store.exists(res.best_source_key)
    assert "KNOBS" in store.get_text(res.best_source_key)
    assert crowned is not recs[0] and res.best.iteration > 1, recs  # improved on its starting knobs
