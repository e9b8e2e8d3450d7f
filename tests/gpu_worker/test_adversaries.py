"""The run-time layers behind the static rules, each against adversaries of its own
(tests/gpu_worker/adversaries: candidates that run arbitrary Python, judged with the static rules off):
frames reached through generators, coroutines and tracebacks, objects through the garbage collector, the
values of timed calls predicted, timers and recorded times rewritten, work finished by a thread behind a
patched output check, code left for the interpreter to run later, a module planted under a harness's name,
the dispatch guard popped, switched off or bypassed and put back. Each fails with
its own trick. Where a layer is proven on its own (frames reachable, torch free), the adversary runs in
this process on a candidate child's real timing loop."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gpu_worker.sandbox import Rejection
from tests.gpu_worker.harnesses import req
from tests.gpu_worker.test_timing_inputs import InProcess, _server

ADVERSARIES = Path(__file__).parent / "adversaries"

#: adversary, problem, the rule it is refused by, a word of the refusal that names its trick
CASES = [
    ("frames_generator", "softmax", "escape", "gi_frame"),
    ("frames_coroutine", "softmax", "escape", "cr_frame"),
    ("frames_traceback", "softmax", "escape", "tb_frame"),
    ("objects_gc", "softmax", "escape", "gc.get_referrers"),
    ("future_values", "softmax", "escape", "sys._getframe"),
    ("rewrite_times", "softmax", "escape", "sys._getframe"),
    ("timer_in_call", "softmax", "timer", "perf_counter"),
    ("thread_after_return", "softmax", "lazy-output", "thread"),
    ("raw_thread_after_return", "softmax", "lazy-output", "thread"),
    ("trace_hook", "softmax", "escape", "sys.settrace"),
    ("later_gc_callback", "softmax", "escape", "gc.callbacks"),
    ("later_planted_module", "softmax", "escape", "gpu_worker.timing"),
    ("later_import_finder", "softmax", "escape", "sys.meta_path"),
    ("guard_popped", "softmax", "escape", "_pop_torch_dispatch_stack"),
    ("guard_disabled", "softmax", "escape", "_DisableTorchDispatch"),
    ("guard_key_excluded", "softmax", "escape", "_ExcludeDispatchKeyGuard"),
    ("guard_defaults_read", "softmax", "escape", "__defaults__"),
    ("guard_popped_mla", "mla_decode", "escape", "_pop_torch_dispatch_stack"),
    ("frames_generator_mla", "mla_decode", "escape", "gi_frame"),
]


def adversary(name: str) -> str:
    return (ADVERSARIES / f"{name}.py").read_text()


@pytest.mark.parametrize("name,problem,rule,trick", CASES)
def test_each_adversary_fails_with_its_trick(judge_raw, store, name, problem, rule, trick):
    v = judge_raw.verify(req(store, adversary(name), problem))
    assert not v.ok, name
    assert v.reason.startswith(rule) and trick in v.reason, v.reason


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"adversary_{name}", ADVERSARIES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _candidate(tmp_path, monkeypatch, name: str):
    """A candidate child's Server in this process, the adversary loaded as its module (its Triton
    interpreted) and called without the guard: frames, objects and torch all within its reach, as if every
    other layer had been escaped."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    s = _server(tmp_path, "cand", "candidate", "softmax")
    s.module = mod = _load(name)
    s._fn = lambda: mod.run
    return s, mod


def test_where_frames_are_reachable_no_timed_call_s_values_can_be_predicted(tmp_path, monkeypatch):
    """The issue's attack, with the frames in reach: the adversary finds the timing loop's frame, prepares
    an answer for every repetition of the block in its first (untimed) call and only copies it in while
    timed. Each key is drawn after the call before it returned, so every prepared answer is for other
    values, and the fingerprints refuse the calls."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.scheduling import Scheduler
    from workflows.artifacts import ArtifactStore

    monkeypatch.setenv("MARATHON_ARTIFACTS", str(tmp_path / "art"))
    ev = Evaluator(store=ArtifactStore(tmp_path / "art"), interpreter=True, scheduler=Scheduler(spares=0))
    try:
        cand, mod = _candidate(tmp_path, monkeypatch, "future_values")
        ref = _server(tmp_path, "ref", "reference", "softmax")
        p = ref.problem
        dist = p.distributions[0]
        plan = {"blocks": 1, "reps": 3, "warmup": 1, "rotate": 2, "pool": 2, "host_reps": 1}
        for s in (cand, ref):
            s.cmd_prepare(rotate=2, pool=2, dist=dist, seed=ev.timing_seed)
        res = ev._interleave(p, dist, InProcess(cand), InProcess(ref), None, plan, None)
        assert len(mod.PLAN) >= 4  # it found the frame and answered every repetition ahead
        with pytest.raises(Rejection, match="timed-output"):
            ev._check_fingerprints(p, ref.shape, dist, res)
    finally:
        ev.close()


def test_where_frames_are_reachable_recorded_times_cannot_be_rewritten(tmp_path, monkeypatch):
    cand, _ = _candidate(tmp_path, monkeypatch, "rewrite_times")
    cand.cmd_prepare(rotate=2, pool=2, dist="normal", seed=5)
    r = cand.cmd_time(reps=4, warmup=1, dist="normal")
    assert len(r.times) == 4 and min(r.times) > 1e-3, r.times  # interpreted calls take milliseconds


def test_the_dispatch_guard_sees_writes_made_while_it_was_off_the_stack():
    """Popped by torch's raw entry (which the guard's wrappers would refuse in a child) and put back: a
    write to an output the guard did not see is counted against torch's version counter when it exits."""
    from gpu_worker.guard import GuardViolation, dispatch_guard

    x, y = torch.randn(4, 8), torch.empty(4, 8)
    with dispatch_guard(outputs={"y": y}):  # an honest call: a copy the guard saw
        y.copy_(x)
    pop, push = torch._C._pop_torch_dispatch_stack, torch._C._push_on_torch_dispatch_stack
    with pytest.raises(GuardViolation, match="with the dispatch guard on"):
        with dispatch_guard(outputs={"y": y}):
            mode = pop(None)
            y.copy_(torch.softmax(x, -1))
            push(mode)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Other(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with pytest.raises(GuardViolation, match="a mode was pushed or popped"):
        with dispatch_guard(outputs={"y": y}) as g:
            mode = pop(None)
            torch._C._push_on_torch_dispatch_stack(Other())
            push(mode)
            try:
                y.fill_(0)
            finally:
                pop(None), pop(None)
                push(g)
