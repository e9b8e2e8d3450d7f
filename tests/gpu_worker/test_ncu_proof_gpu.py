"""The ncu proof on a GPU (marked `gpu`; skipped without CUDA, or without Nsight Compute on PATH or under
/opt/nvidia/nsight-compute): an honest softmax re-measured as a would-be best is proven by ncu's trace of a
separate process, its per-call kernel time within the tolerance of the judged time; a candidate whose thread
launches its kernel after the call returned is refused by the trace; and the honest one is proven under
the proof's `unix` wall variant (MARATHON_NCU_PROOF_WALL) and with no OS wall, which tells, should the
default fail, whether the wall is why. Each proof's line is printed (`-s`)."""

from __future__ import annotations

import hashlib

import pytest

from gpu_worker.ncu_trace import find_ncu

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(find_ncu() is None, reason="Nsight Compute (ncu) is neither on PATH nor under "
                                 "/opt/nvidia/nsight-compute")]

LATE_THREAD = '''
import threading
import time

import triton
import triton.language as tl


@triton.jit
def late_softmax(x_ptr, y_ptr, N, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + cols, mask=cols < N, other=-float("inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * stride + cols, e / tl.sum(e, 0), mask=cols < N)


def run(inputs, out):
    x, y = inputs["x"], out["y"]
    M, N = x.shape
    late_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))

    def later():  # the same work again, once the harness believes the call is over
        time.sleep(0.3)  # past ncu's own time per launch; within the proof's wait after the last call
        late_softmax[(M,)](x, y, N, x.stride(0), BLOCK=triton.next_power_of_2(N))

    threading.Thread(target=later, daemon=True).start()
'''


@pytest.fixture(scope="module")
def ev(tmp_path_factory):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings
    from workflows.artifacts import ArtifactStore

    e = Evaluator(store=ArtifactStore(tmp_path_factory.mktemp("art")), interpreter=False, scheduler=Scheduler(spares=1),
                  settings=GpuWorkerSettings(ncu_proof_share=0.0),  # only would-be bests are proven here
                  timeouts={"load": 60, "profile": 90})  # a proof that hangs fails within minutes
    yield e
    e.close()


def _bench(ev, fresh: bool):
    from gpu_worker.canaries import canary_source
    from workflows.contracts import BenchRequest

    src = canary_source("fast")
    return ev.benchmark(BenchRequest(problem="softmax", candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                                     source_key=ev.store.put_text(src), fresh_process=fresh)), src


@pytest.fixture(scope="module")
def judged(ev):
    """The fast canary's judged figure from a plain benchmark (no proof drawn): what the proofs compare with."""
    b, src = _bench(ev, fresh=False)
    assert b.ok and b.receipt.proof == "", b.reason
    return b, src


def _prove(ev, source: str, judged_report):
    from baselines.registry import get_problem

    p = get_problem("softmax")
    r = ev.proof.proof_if_due(True, p, p.shapes[0], source, judged_report.deciding_dist, judged_report.time_ms,
                              None, [0.0])
    print(f"ncu proof: {r.text}")
    return r


def test_a_would_be_best_is_proven_by_ncu_in_a_separate_process(ev):
    b, _ = _bench(ev, fresh=True)  # the re-measure of a would-be best: cross-check, then the proof
    print(f"receipt: {b.receipt.proof if b.receipt else None} (reason: {b.reason[:2000]})")
    assert b.ok, b.reason
    assert b.receipt.proof.startswith("ncu proof: [") and "proven: ncu kernel time" in b.receipt.proof
    assert "ncu proof: [" in ev.store.get_text(b.log_key)


@pytest.mark.parametrize("problem", ["mla_decode", "kda"])
def test_a_starting_kernel_re_measured_as_a_would_be_best_is_proven(ev, problem):
    """The proof at the problems' own scale: several launches per call (decode's split and combine, KDA's prep
    and state pass) and the baseline's reference beside it."""
    from baselines.registry import get_problem
    from workflows.contracts import BenchRequest

    p = get_problem(problem)
    src = p.render(p.default_knobs())
    b = ev.benchmark(BenchRequest(problem=problem, candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                                  source_key=ev.store.put_text(src), fresh_process=True))
    print(f"{problem} receipt: {b.receipt.proof if b.receipt else None} (reason: {b.reason[:2000]})")
    assert b.ok, b.reason
    assert "proven: ncu kernel time" in b.receipt.proof


def test_a_kernel_a_thread_launches_after_the_call_returned_is_refused(ev, judged):
    """Refused by one of two layers: the run-time guard in the proof's own process (the thread left running,
    seen first on an H100) or, should a candidate slip past it, ncu's trace (its kernel outside any call)."""
    r = _prove(ev, LATE_THREAD, judged[0])
    assert r.ok is False and r.family == "lazy-output", r.text
    if r.verdict is None:
        assert "thread(s) of its own running after its call returned" in r.text
    else:
        assert any("'late_softmax'" in x and "outside any call (after the last call returned)" in x
                   for x in r.verdict.refusals)


@pytest.mark.parametrize("update", [{"ncu_proof_wall": "unix"}, {"wall": "off"}], ids=["unix-sockets", "no-os-wall"])
def test_the_wall_variants_prove_the_honest_candidate_too(ev, judged, update):
    """Which wall lets ncu work, should the default fail: the candidate children's plus AF_UNIX sockets
    (a setting), and, to tell the wall from the rest, none at all (an operator's opt-out, MARATHON_WALL=off)."""
    b, src = judged
    keep = ev.ctx.settings
    ev.ctx.settings = keep.model_copy(update=update)
    try:
        r = _prove(ev, src, b)
    finally:
        ev.ctx.settings = keep
    assert r.ok is True, r.text
