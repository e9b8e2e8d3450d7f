"""The run-time layers behind the static rules, each against adversaries of its own
(tests/gpu_worker/adversaries: candidates that run arbitrary Python, judged with the static rules off):
frames reached through generators, coroutines and tracebacks, objects through the garbage collector, the
values of timed calls predicted, timers and recorded times rewritten, work finished by a thread behind a
patched output check, code left for the interpreter to run later, a module planted under a harness's name,
the dispatch guard popped, switched off or bypassed and put back, numpy reached through the names
Triton's interpreter adds to a kernel's module. Each fails with
its own trick. Where a layer is proven on its own (frames reachable, torch free), the adversary runs on a
candidate child's real timing loop in a process of its own, without the guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.gpu_worker.harnesses import req

ADVERSARIES = Path(__file__).parent / "adversaries"
REPO = Path(__file__).resolve().parents[2]

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
    ("interpreter_globals", "softmax", "exception", "'np' is not defined"),
    ("interpreter_globals_kernel", "softmax", "compile", "'np' is not defined"),
]


def adversary(name: str) -> str:
    return (ADVERSARIES / f"{name}.py").read_text()


@pytest.mark.parametrize("name,problem,rule,trick", CASES)
def test_each_adversary_fails_with_its_trick(judge_raw, store, name, problem, rule, trick):
    v = judge_raw.verify(req(store, adversary(name), problem))
    assert not v.ok, name
    assert v.reason.startswith(rule) and trick in v.reason, v.reason


# Where a layer is held alone: the adversary is loaded as a candidate child's module in a process of its
# own (its Triton interpreted from the start) and called without the guard, so that frames, objects and
# torch are all within its reach, as if every other layer had been escaped.
_ALONE = r"""
import importlib.util, json, sys, tempfile
from pathlib import Path
from gpu_worker import child, protocol, wire
from gpu_worker.harness import Evaluator
from gpu_worker.sandbox import Rejection
from gpu_worker.device.scheduling import Scheduler
from workflows.artifacts import ArtifactStore

name, tmp = sys.argv[1], Path(tempfile.mkdtemp())
spec = importlib.util.spec_from_file_location(name, sys.argv[2])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)


class InProcess:
    def __init__(self, s):
        self.s = s

    def call(self, request, timeout, hb=None):
        return wire.Reply(seq=None, result=child.serve(self.s, request))


def server(role):
    d = tmp / role; d.mkdir()
    s = child.Server(str(d), role)
    if role == "reference":
        s.cmd_setup("softmax", None)
    else:
        s.core._setup_problem("softmax", None)
        s.core.module, s.timing._fn = mod, (lambda: mod.run)
    return s


cand, ref = server("candidate"), server("reference")
out = {}
if name == "future_values":
    ev = Evaluator(store=ArtifactStore(tmp / "art"), interpreter=True, scheduler=Scheduler(spares=0))
    plan = {"blocks": 1, "reps": 3, "warmup": 1, "rotate": 2, "pool": 2, "host_reps": 1}
    for s in (cand, ref):
        s.cmd_prepare(rotate=2, pool=2, dist="normal", seed=ev.timing_seed)
    res = ev.bench_stage.interleave(ref.core.problem, "normal", InProcess(cand), InProcess(ref), None, plan, None)
    out["prepared"] = len(mod.PLAN)
    try:
        ev.timed_outputs.check_fingerprints(ref.core.problem, ref.core.shape, "normal", res)
        out["verdict"] = "passed"
    except Rejection as e:
        out["verdict"] = e.reason
    ev.close()
else:
    cand.cmd_prepare(rotate=2, pool=2, dist="normal", seed=5)
    out["times"] = cand.cmd_time(reps=4, warmup=1, dist="normal").times
print(json.dumps(out))
"""


def _alone(name: str, tmp_path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "MARATHON_ARTIFACTS": str(tmp_path / "art")}
    r = subprocess.run([sys.executable, "-c", _ALONE, name, str(ADVERSARIES / f"{name}.py")], env=env,
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_where_frames_are_reachable_no_timed_call_s_values_can_be_predicted(tmp_path):
    """The issue's attack, with the frames in reach: the adversary finds the timing loop's frame, prepares
    an answer for every repetition of the block in its first (untimed) call and only copies it in while
    timed. Each key is drawn after the call before it returned, so every prepared answer is for other
    values, and the fingerprints refuse the calls."""
    got = _alone("future_values", tmp_path)
    assert got["prepared"] >= 4, got  # it found the frame and answered every repetition ahead
    assert got["verdict"].startswith("timed-output"), got


def test_where_frames_are_reachable_recorded_times_cannot_be_rewritten(tmp_path):
    times = _alone("rewrite_times", tmp_path)["times"]
    assert len(times) == 4 and min(times) > 1e-3, times  # interpreted calls take milliseconds


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
