"""The worker's channel to a child (gpu_worker.sandbox): a reply always answers its own request; a child
that hangs, crashes, raises or runs out of memory is contained (static rules off, `judge_raw`) and the
evaluator keeps serving."""

import pickle

import pytest

from gpu_worker.protocol import CudaInit
from gpu_worker.sandbox import Sandbox, SandboxFailure
from tests.gpu_worker.harnesses import canary, kernel, req


class Interrupted(Exception):
    """Stands for an activity's cancellation, which temporalio raises in the activity's thread."""


def test_a_call_interrupted_before_its_reply_kills_the_child():
    # a call cancelled while the child works leaves that reply in the pipe; unless the child is killed,
    # every later call reads its predecessor's reply
    sb = Sandbox("candidate", interpreter=True)
    try:
        sb.wait_ready()

        def cancelled():
            raise Interrupted()

        with pytest.raises(Interrupted):
            sb.call(CudaInit(), 60, heartbeat=cancelled)  # the request is sent; the wait is interrupted
        assert sb.closed and not sb.alive()
        with pytest.raises(SandboxFailure, match="already closed"):
            sb.call(CudaInit(), 60)
    finally:
        sb.close()


def test_a_reply_to_another_request_is_refused():
    sb = Sandbox("candidate", interpreter=True)
    try:
        sb.wait_ready()
        assert sb.call(CudaInit(), 60).ok
        # a request whose reply nobody read (what an interrupted call would leave behind)
        sb._send.send_bytes(pickle.dumps({"cmd": "cuda_init", "seq": 999}))
        with pytest.raises(SandboxFailure, match="out of step"):
            sb.call(CudaInit(), 60)
        assert sb.closed
    finally:
        sb.close()


def test_a_hang_is_contained_as_a_timeout(judge_raw, store, monkeypatch):
    # the limits shortened for this candidate alone (its first call is the compile's): any limit bounds a hang
    for stage in ("compile", "verify"):
        monkeypatch.setitem(judge_raw.timeouts, stage, 15)
    v = judge_raw.verify(req(store, kernel("rt_hang")))
    assert not v.ok and v.stage == "sandbox" and "timeout" in v.reason, v


@pytest.mark.parametrize("name,stage,words", [
    ("rt_crash", "sandbox", ("crash", "SIGSEGV")),
    ("rt_exception", "verify", ("exception", "blew up on purpose")),
    # printing is in the language; the log it fills is on the worker's disk, and read back from its end
    ("rt_log_flood", "sandbox", ("output", "over 64 MiB")),
])
def test_sandbox_failures_contained(judge_raw, store, name, stage, words):
    v = judge_raw.verify(req(store, kernel(name)))
    assert not v.ok and v.stage == stage, v
    for w in words:
        assert w in v.reason, v.reason


def test_memory_limit_contained(store):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    e = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0), static_rules=False,
                  timeouts={"verify": 60}, settings=GpuWorkerSettings(sandbox_mem_gb=3))
    try:
        v = e.verify(req(store, kernel("rt_memory")))
    finally:
        e.close()
    assert not v.ok
    assert ("oom" in v.reason or "memory" in v.reason), v.reason


def test_still_serving_after_failures(ev_raw, store):
    v = ev_raw.verify(req(store, canary("fast")))
    assert v.ok, v.reason


def test_only_trusted_children_share_the_hosts_triton_cache_and_its_autotuning(tmp_path):
    from gpu_worker.caches import triton_cache_dir
    from gpu_worker.sandbox import triton_env
    from gpu_worker.settings import GpuWorkerSettings

    s = GpuWorkerSettings(cache_dir=tmp_path / "cache")
    cand = triton_env("candidate", str(tmp_path / "c"), s, False)
    ref = triton_env("reference", str(tmp_path / "r"), s, False)
    assert cand["TRITON_CACHE_DIR"].startswith(str(tmp_path / "c")) and cand["TRITON_CACHE_AUTOTUNING"] == "0"
    assert ref == {"TRITON_CACHE_DIR": str(triton_cache_dir(s, False)), "TRITON_CACHE_AUTOTUNING": "1"}
    # under the cache root, which survives restarts, one folder per GPU model
    assert ref["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton" / "cpu")
