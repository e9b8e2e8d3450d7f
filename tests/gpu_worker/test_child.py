"""A sandbox child's own commands and limits (gpu_worker.child, child.core, child.verify): its CUDA
context and Triton keys, the verification in one command, the limits it sets itself."""

from __future__ import annotations

from gpu_worker.protocol import CudaInit, WarmTriton
from tests.gpu_worker.harnesses import canary


def test_context_and_triton_keys_are_two_commands():
    """The CUDA context (made in a device job) and Triton's per-process keys (host work, outside any turn)
    are separate child commands, each idempotent; on the CPU both are no-ops that answer."""
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True)
    try:
        for request in (CudaInit(), WarmTriton(), WarmTriton()):
            r = sb.call(request, 120)
            assert r.ok, r
    finally:
        sb.close()


def test_verification_is_one_command_with_each_steps_time(ev, store):
    """The verify stage is one command: every case, the rerun and the stale probe run in it, in order, and
    its reply carries per case what the worker judges, with each step's seconds. The comparisons are not
    the child's: it reports handles of its outputs' files, which `write_exports` writes."""
    from pathlib import Path

    from baselines.registry import get_problem
    from gpu_worker.protocol import Verify, WriteExports

    p = get_problem("softmax")
    cases = list(ev.ctx.cases(p, "steps"))
    sb, _ = ev.children.loaded_child(("x",), canary("fast"), p, ev.ctx.shape(p, None), None)
    try:
        r = sb.call(Verify(cases=cases), 120).result
        assert [(c.dist, c.seed) for c in r.cases] == cases
        assert r.rerun is not None and r.stale is not None and r.stale.case == 1 and r.changed == []
        assert not any(c.mutated for c in r.cases) and all(c.out_type_ok for c in r.cases)
        for step in ("prepare.upload", "inputs", "hash-copy", "first-call", "call", "export", "rerun", "stale",
                     "download"):
            assert r.timing[step] >= 0, (step, r.timing)
        handles = [h for c in r.cases for h in c.outputs.values()] + list(r.rerun.values())
        assert handles and not any(Path(h.path).exists() for h in handles)  # written by write_exports only
        assert sb.call(WriteExports(), 120).result.changed == []
        assert all(Path(h.path).exists() for h in handles)
        r = sb.call(Verify(cases=cases[:1], rerun=False, stale=False), 120).result  # a second stage: its own
        assert len(r.cases) == 1 and r.rerun is None and r.stale is None and "rerun" not in r.timing
    finally:
        sb.close()


def test_child_sets_its_limits_itself_without_code_between_fork_and_exec():
    """No core dumps and, under the interpreter, an address-space cap: set by the child first thing (no
    preexec_fn, which can deadlock a multi-threaded worker's fork; a CI run hung that way)."""
    import inspect
    import os

    from gpu_worker import sandbox
    from gpu_worker.device.scheduling import TIMING_CPUS, Scheduler

    assert "preexec_fn=" not in inspect.getsource(sandbox)
    sb = Scheduler().spawn("candidate", interpreter=True)
    try:
        assert sb.call(CudaInit(), 120).ok  # the child is up and serving
        limits = open(f"/proc/{sb.proc.pid}/limits").read().splitlines()
        core = next(line for line in limits if line.startswith("Max core file size")).split()
        assert core[4:6] == ["0", "0"]
        space = next(line for line in limits if line.startswith("Max address space")).split()
        assert int(space[3]) == 2 * sb.mem_limit
        if TIMING_CPUS:
            assert os.sched_getaffinity(sb.proc.pid) == set(TIMING_CPUS[1])
    finally:
        sb.close()


def test_a_flush_that_did_not_capture_is_named_in_the_prepare_reply(tmp_path):
    """A child's own output goes nowhere: an L2 flush left on the stream (it delays the timed graph behind
    it) is named in the timing-set preparation's reply, which the worker writes to its phase log."""
    import torch

    from gpu_worker import child

    s = child.Server(str(tmp_path), "reference")
    s.cmd_setup("softmax", None)
    dist = s.core.problem.distributions[0]
    assert "flush-on-stream" not in s.cmd_prepare(rotate=2, pool=2, dist=dist, seed=3).timing  # no CUDA: no flush
    s.core.cuda, s.timing.flush = True, torch.zeros(4)  # as on a GPU where the flush's capture failed
    assert s.cmd_prepare(rotate=2, pool=2, dist=dist, seed=3).timing["flush-on-stream"] == 1
    s.timing.flush_graph = object()  # captured
    assert "flush-on-stream" not in s.cmd_prepare(rotate=2, pool=2, dist=dist, seed=3).timing


def test_an_out_of_memory_ends_a_candidate_child_but_not_the_reference_child(tmp_path):
    # the candidate's context is never trusted again; the trusted child failed beside the neighbours' memory
    from gpu_worker.child.core import ChildCore

    class OutOfMemoryError(RuntimeError):
        pass

    for role, fatal in (("candidate", True), ("reference", False)):
        core = ChildCore(str(tmp_path), role)
        try:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
        except OutOfMemoryError as e:
            f = core.describe_failure(e)
        assert f.kind == "oom" and f.fatal is fatal, (role, f)


def test_a_candidate_childs_parts_and_what_each_was_built_with_are_pinned(tmp_path):
    """The Server is composed of parts; in a candidate's child, which part each attribute holds, what each
    part was built with (its PINNED) and each part's methods are pinned by identity before the candidate
    loads: a rebinding of any of them is named (gpu_worker.pins)."""
    from gpu_worker import child
    from gpu_worker.child.timing import ChildTiming

    s = child.Server(str(tmp_path), "candidate")
    pins = s.pins
    assert pins.changed() == []
    slots = [(s, name) for name in child.PARTS]
    slots += [(getattr(s, name), key) for name in child.PARTS for key in type(getattr(s, name)).PINNED]
    assert len(slots) > 2 * len(child.PARTS)
    for holder, key in slots:
        name = "server" if holder is s else next(n for n in child.PARTS if getattr(s, n) is holder)
        was = vars(holder)[key]
        vars(holder)[key] = object()
        assert pins.changed() == [f"{name}.{key}"], (name, key)
        vars(holder)[key] = was
    assert pins.changed() == []
    original = ChildTiming._before_rep
    try:
        ChildTiming._before_rep = lambda *a, **k: None  # a part's method
        assert pins.changed() == ["gpu_worker.child.timing.ChildTiming._before_rep"]
    finally:
        ChildTiming._before_rep = original
    assert pins.changed() == []


def test_autotuning_chosen_during_the_compile_s_warmup_is_forgotten():
    """Compile runs every launch as Triton's warmup path (nothing runs): an autotuner's choice made there
    rests on timings of nothing, so it is emptied, through a heuristic wrapped around it too."""
    import triton
    import triton.language as tl

    from gpu_worker.child.loading import forget_autotuning

    @triton.heuristics(values={"B2": lambda args: args["B"] * 2})
    @triton.autotune(configs=[triton.Config({"B": 64}), triton.Config({"B": 128})], key=["n"])
    @triton.jit
    def k(x, n, B: tl.constexpr, B2: tl.constexpr):
        pass

    tuner = k.fn
    tuner.cache[(300,)] = tuner.configs[1]
    forget_autotuning([k, 3, None])
    assert type(tuner).__name__ == "Autotuner" and tuner.cache == {}


def test_the_reference_child_draws_several_cases_at_once_with_the_values_of_draws_alone(tmp_path, monkeypatch):
    """An empty host's first verification and timing sets wait for the reference child's draws: it makes
    them on threads of its own, each case with its own generator, so a case's values are those a draw alone
    makes (a candidate's child, which runs no harness thread beside its candidate, draws one at a time)."""
    import threading

    import torch

    from gpu_worker import child
    from gpu_worker.child import inputs as child_inputs

    monkeypatch.setattr(child_inputs, "GENERATION_THREADS", 3)
    drawn, ref = {}, None
    for role in ("reference", "candidate"):
        s = child.Server(str(tmp_path / role), role)
        if role == "reference":
            s.cmd_setup("softmax", None)
            ref = s.core
        else:  # the problem and shape a load would set, without a candidate
            s.core.problem, s.core.shape, s.core.make_inputs = ref.problem, ref.shape, ref.problem.make_inputs
        threads, make = set(), s.core.make_inputs

        def counted(*a, _make=make, _threads=threads, **k):
            _threads.add(threading.current_thread().name.split("_")[0])
            return _make(*a, **k)

        s.core.make_inputs = counted
        dists = s.core.problem.distributions
        cases = [(d, seed) for seed in range(3) for d in dists]
        drawn[role] = s.inputs.host_inputs(cases + cases[:1])  # a case asked twice is drawn once
        assert list(drawn[role]) == cases
        assert threads == ({"inputs"} if role == "reference" else {"MainThread"}), (role, threads)
    for c in drawn["reference"]:
        one, other = drawn["reference"][c], drawn["candidate"][c]
        assert one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one), c


def test_a_candidate_childs_staging_buffers_are_pinned(tmp_path):
    """The pinned staging's buffers carry every output downloaded from a candidate's child: replacing one
    (or the staging, or what it copies with) is named, and its own buffers, once made, are not."""
    import torch

    from gpu_worker import child

    s = child.Server(str(tmp_path), "candidate")
    st = s.core.staging
    assert s.pins.changed() == []
    st.buffers = (torch.zeros(4, dtype=torch.uint8),) * 2
    assert s.pins.changed() == ["staging.buffers"]
    st.buffers = None
    assert s.pins.changed() == []
    st.cuda, st.chunk = True, 64  # as on a GPU: ready() makes them and pins them again
    try:
        st.ready()
    except (RuntimeError, AssertionError):  # no CUDA here: pinned memory cannot be made
        return
    assert s.pins.changed() == []


def test_a_problem_drawing_from_torch_s_global_generator_is_drawn_one_case_at_a_time(tmp_path, monkeypatch):
    """A KernelBench file seeds torch's global generator: drawn on two threads at once, two cases would
    interleave their draws, so the reference child draws such a problem's cases on its own thread."""
    import threading

    from gpu_worker import child
    from gpu_worker.child import inputs as child_inputs

    monkeypatch.setattr(child_inputs, "GENERATION_THREADS", 3)
    s = child.Server(str(tmp_path), "reference")
    s.cmd_setup("softmax", None)
    s.core.problem = type("GlobalDraws", (type(s.core.problem),), {"own_generators": False})()
    names, make = set(), s.core.make_inputs

    def counted(*a, **k):
        names.add(threading.current_thread().name)
        return make(*a, **k)

    s.core.make_inputs = counted
    s.inputs.host_inputs([(d, seed) for seed in range(3) for d in s.core.problem.distributions])
    assert names == {"MainThread"}


def test_the_reference_child_s_copies_to_and_from_the_device_go_through_its_staging(tmp_path, monkeypatch):
    """Every copy between host memory and the device goes through the child's pinned staging (on a GPU two
    pinned buffers; here the plain copies it falls back to): the cases' uploads, the timing pool's, and the
    oracles' download into the cases' cache."""
    from gpu_worker import child

    monkeypatch.setenv("MARATHON_CACHE_DIR", str(tmp_path / "cache"))
    s = child.Server(str(tmp_path / "ref"), "reference")
    s.cmd_setup("softmax", None)
    calls = []
    staging = s.core.staging
    up, down = staging.upload, staging.download
    staging.upload = lambda v, device: (calls.append("up"), up(v, device))[1]
    staging.download = lambda v: (calls.append("down"), down(v))[1]
    dists = s.core.problem.distributions
    s.reference.cmd_reference([(dists[0], 0)])
    n_inputs = len(s.core.problem.make_inputs(s.core.shape, dists[0], 0, "cpu", cpu=True))
    assert calls.count("up") == n_inputs, calls
    assert s.reference.case_cache.enabled and calls.count("down") == len(s.core.outputs), calls
    calls.clear()
    s.cmd_prepare(rotate=2, pool=2, dist=dists[0], seed=5)
    assert calls.count("up") == 2 * n_inputs, calls  # the pool's two sets
