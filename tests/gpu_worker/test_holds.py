"""No host work inside a device turn: the device owner's turns wrap device work only, so a timing block waits
for uploads and kernel runs, never for process spawns, imports, compiles, input generation, bank reads or
files. And no job of ours overlaps a timing block.

The real harness under the interpreter, whose own turns are no-ops (no device), with a recording stand-in in
their place: the real DeviceOwner underneath, plus a record of every turn and of every sandbox command, child
spawn and artifact-store access with the turns its thread held at that moment."""

from __future__ import annotations

import pytest

import contextlib
import hashlib
import threading
import time

from workflows.contracts import BenchRequest, EvalRequest

#: sandbox commands that are host work only: a child's import of the candidate, Triton's keys, the compiler,
#: writing files, the reference's setup (imports, the baseline's construction), reading or generating inputs
HOST_COMMANDS = {"load", "warm_triton", "compile", "write_exports", "setup", "stage", "receipt", "park"}


class RecordingOwner:
    def __init__(self):
        from gpu_worker.device.owner import DeviceOwner

        self.owner = DeviceOwner(max_jobs=2)
        self._local = threading.local()
        self._mu = threading.Lock()
        self.holds: list[tuple[str, float, float, int]] = []  # (kind, start, end, thread)
        self.events: list[tuple[str, str, float, int]] = []  # (kind, what, when, holds of its thread then)

    def depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextlib.contextmanager
    def _held(self, kind: str):
        self._local.depth = self.depth() + 1
        t0 = time.monotonic()
        try:
            yield
        finally:
            with self._mu:
                self.holds.append((kind, t0, time.monotonic(), threading.get_ident()))
            self._local.depth -= 1

    @contextlib.contextmanager
    def job(self, also=None):
        with self.owner.job(also=also), self._held("job"):
            yield

    @contextlib.contextmanager
    def timing(self):
        with self.owner.timing(), self._held("timing"):
            yield

    @contextlib.contextmanager
    def with_ref(self, lock, timing: bool = False):
        """DeviceTurns.with_ref's order: a timing block takes its turn, then the child's lock."""
        if timing:
            with self.timing(), lock:
                yield
        else:
            with self.job(also=lock):
                yield

    def note(self, kind: str, what: str) -> None:
        with self._mu:
            self.events.append((kind, what, time.monotonic(), self.depth()))


@pytest.mark.slow(25)
def test_turns_wrap_device_work_only_and_no_job_overlaps_timing(tmp_path, monkeypatch):
    from gpu_worker import harness
    from gpu_worker.canaries import canary_source
    from gpu_worker.sandbox import Sandbox
    from gpu_worker.device.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    rec = RecordingOwner()
    call, init = Sandbox.call, Sandbox.__init__

    def recorded_call(self, request, *a, **kw):
        rec.note("command", request.cmd)
        return call(self, request, *a, **kw)

    def recorded_init(self, role, *a, **kw):
        rec.note("spawn", role)
        init(self, role, *a, **kw)

    monkeypatch.setattr(Sandbox, "call", recorded_call)
    monkeypatch.setattr(Sandbox, "__init__", recorded_init)
    store = ArtifactStore(tmp_path / "art")
    e = harness.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    e.turns.job, e.turns.timing, e.turns.with_ref = rec.job, rec.timing, rec.with_ref
    get, put = store.get_text, store.put_text
    store.get_text = lambda key: (rec.note("store", "read"), get(key))[1]
    store.put_text = lambda text: (rec.note("store", "write"), put(text))[1]

    def req(name):
        src = canary_source(name)
        return EvalRequest(problem="softmax", candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                           source_key=put(src))

    try:
        fast, slow = req("fast"), req("slow")
        assert e.compile(fast).ok
        v = e.verify(fast.model_copy(update={"random_shape": True}))  # and a new reference child there
        assert v.ok and v.random_shape, v.reason
        # one candidate's timing while another compiles beside it
        out = {}
        side = threading.Thread(target=lambda: out.update(c=e.compile(slow)))
        side.start()
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=fast.candidate_id,
                                     source_key=fast.source_key))
        side.join(600)
        assert b.ok and out["c"].ok, (b.reason, out)
    finally:
        e.close()

    spawned = [x for x in rec.events if x[0] == "spawn"]
    assert any(w == "reference" for _, w, _, _ in spawned) and any(w == "candidate" for _, w, _, _ in spawned)
    inside = [(k, w) for k, w, _, depth in rec.events
              if depth and (k in ("spawn", "store") or w in HOST_COMMANDS)]
    assert not inside, f"host work inside a device turn: {inside}"
    # device work did take turns: uploads, verification steps, timing
    held = {w for k, w, _, depth in rec.events if depth and k == "command"}
    assert {"prepare", "verify", "time", "compare", "cuda_init"} <= held, held
    timed = [(t0, t1) for kind, t0, t1, _ in rec.holds if kind == "timing"]
    assert timed and all(
        not (s0 < t1 and t0 < s1) for kind, s0, s1, _ in rec.holds if kind == "job" for t0, t1 in timed), \
        "a device job overlapped a timing block"
    assert all(not (a0 < b1 and b0 < a1) for i, (a0, a1) in enumerate(timed) for b0, b1 in timed[i + 1:]), \
        "two timing blocks overlapped"
    for k, w, when, depth in rec.events:  # every timed call ran inside a timing block
        if w == "time":
            assert any(t0 <= when <= t1 for t0, t1 in timed)


@pytest.mark.slow(55)
def test_a_child_loaded_for_a_benchmark_compiles_before_its_upload(tmp_path, monkeypatch):
    """The candidate's and the current best's children, loaded afresh for a benchmark (none kept from an
    earlier stage), compile outside any turn before their timing sets are uploaded: on CUDA the upload job
    loads the kernels, and a kernel not compiled yet would be compiled there, inside the turn."""
    from gpu_worker import harness
    from gpu_worker.canaries import canary_source
    from gpu_worker.sandbox import Sandbox
    from gpu_worker.device.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore
    from workflows.contracts import BestRef

    rec = RecordingOwner()
    call = Sandbox.call
    seen: dict[int, list[tuple[str, bool, int]]] = {}  # per child: (command, a timing set's upload, turns held)

    def recorded_call(self, request, *a, **kw):
        seen.setdefault(id(self), []).append(
            (request.cmd, getattr(request, "rotate", None) is not None, rec.depth()))
        return call(self, request, *a, **kw)

    monkeypatch.setattr(Sandbox, "call", recorded_call)
    store = ArtifactStore(tmp_path / "art")
    e = harness.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0))
    e.turns.job, e.turns.timing, e.turns.with_ref = rec.job, rec.timing, rec.with_ref

    def req(name):
        src = canary_source(name)
        return EvalRequest(problem="softmax", candidate_id=hashlib.sha256(src.encode()).hexdigest()[:16],
                           source_key=store.put_text(src))

    try:
        fast, slow = req("fast"), req("slow")
        assert e.compile(fast).ok
        assert e.loaded.shed() == 1  # its child closed: the benchmark loads the best's and the candidate's
        best = BestRef(candidate_id=fast.candidate_id, source_key=fast.source_key, speedup=1.0, time_ms=1.0,
                       baseline_ms=1.0, iteration=1, interpreter=True)
        b = e.benchmark(BenchRequest(problem="softmax", candidate_id=slow.candidate_id,
                                     source_key=slow.source_key, best=best))
        assert b.ok, b.reason
    finally:
        e.close()

    timed_children = [cmds for cmds in seen.values() if any(timing_set for _, timing_set, _ in cmds)]
    assert len(timed_children) >= 3  # the candidate, the best, the reference
    for cmds in timed_children:
        names = [c for c, _, _ in cmds]
        if "load" not in names:
            continue  # the reference child: nothing of a candidate's to compile
        first_upload = next(i for i, (_, timing_set, _) in enumerate(cmds) if timing_set)
        compiles = [i for i, (c, _, depth) in enumerate(cmds) if c == "compile"]
        assert compiles and compiles[0] < first_upload, names
        assert all(cmds[i][2] == 0 for i in compiles), "compiled inside a device turn"
