"""A stopping worker finishes what it is running: `marathon worker --role gpu` SIGTERMed while a compile is in
flight (the real GPU worker process under the Triton interpreter, the real dev server) stops taking work,
lets the compile finish and report on its first attempt, naming no queue of its own (the candidate's later
stages go to the shared queue), and exits 0; with no grace the compile is cut."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.common import RetryPolicy
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from tests.gpu_worker.harnesses import canary, req
    from workflows.contracts import CompileReport, EvalRequest


@workflow.defn(name="CompileOnceForShutdownTest")
class CompileOnce:
    @workflow.run
    async def run(self, request: EvalRequest, gpu_queue: str) -> CompileReport:
        return await workflow.execute_activity(
            "compile_candidate", request, result_type=CompileReport, task_queue=gpu_queue,
            start_to_close_timeout=timedelta(seconds=120), retry_policy=RetryPolicy(maximum_attempts=1))


async def _compile_under_sigterm(env, store, tmp_path, grace_s: str):
    """(the workflow's outcome: a CompileReport or the exception, the worker's exit code and output, the
    compile's attempts started)."""
    address = env.client.service_client.config.target_host
    gpu_queue, wf_queue = f"stop-gpu-{uuid.uuid4().hex[:8]}", f"stop-wf-{uuid.uuid4().hex[:8]}"
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "worker", "--role", "gpu", "--address", address, "--gpu-queue", gpu_queue],
            env={**os.environ, "MARATHON_SHUTDOWN_GRACE_S": grace_s}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        request = req(store, f"{canary('fast')}\n# shutdown test {uuid.uuid4().hex}\n")
        async with Worker(env.client, task_queue=wf_queue, workflows=[CompileOnce]):
            h = await env.client.start_workflow(CompileOnce.run, args=[request, gpu_queue],
                                                id=f"stop-{uuid.uuid4().hex[:8]}", task_queue=wf_queue)
            deadline = time.monotonic() + 120
            # the stop once the compile runs in the worker: its first heartbeat arrived. A task the server
            # counts as started may still sit in the SDK's poller, and a stop then loses it until its timeout.
            while True:
                pending = (await h.describe()).raw_description.pending_activities
                if pending and pending[0].state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED \
                        and pending[0].HasField("last_heartbeat_time"):
                    break
                assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()[-3000:]
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            try:
                outcome = await asyncio.wait_for(h.result(), 150)
            except Exception as e:  # noqa: BLE001 - the cut compile fails the workflow
                outcome = e
                while outcome.__cause__ is not None:  # the activity's own failure: timeout, cancel or error
                    outcome = outcome.__cause__
            attempts = [e.activity_task_started_event_attributes.attempt async for e in h.fetch_history_events()
                        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED]
        try:
            rc = await asyncio.to_thread(proc.wait, 120)
        except subprocess.TimeoutExpired:
            raise AssertionError("the worker did not exit within 120 s of its stop:\n"
                                 + log_path.read_text()[-3000:]) from None
        return outcome, rc, log_path.read_text(), attempts
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow(10)
async def test_a_stopped_gpu_worker_lets_its_running_compile_finish(env, store, tmp_path):
    outcome, rc, log, attempts = await _compile_under_sigterm(env, store, tmp_path, "60")
    assert isinstance(outcome, CompileReport) and outcome.ok, (outcome, log[-3000:])
    assert attempts == [1], attempts  # finished where it ran, not retried
    assert outcome.worker_queue is None  # the later stages go to the shared queue, not to this stopped worker
    assert rc == 0 and "stopping: no new work taken; running activities may take up to 60 s" in log, log[-3000:]


@pytest.mark.slow(10)
async def test_with_no_grace_the_running_compile_is_cut(env, store, tmp_path):
    outcome, rc, log, _ = await _compile_under_sigterm(env, store, tmp_path, "0")
    assert not isinstance(outcome, CompileReport), outcome
    assert rc == 0, log[-3000:]


def test_a_bad_grace_is_refused_in_one_line_before_connecting():
    from cli.errors import UsageError
    from cli.workers import SHUTDOWN_GRACE_S, shutdown_grace_s

    assert shutdown_grace_s({}) == SHUTDOWN_GRACE_S and shutdown_grace_s({"MARATHON_SHUTDOWN_GRACE_S": " 5 "}) == 5.0
    for bad in ("-1", "inf", "nan"):
        with pytest.raises(UsageError, match="MARATHON_SHUTDOWN_GRACE_S must be a number of seconds >= 0"):
            shutdown_grace_s({"MARATHON_SHUTDOWN_GRACE_S": bad})
    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", "MARATHON_SHUTDOWN_GRACE_S": "soon"}
    p = subprocess.run([sys.executable, "-m", "cli", "worker", "--role", "agent"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == \
        "marathon: error: MARATHON_SHUTDOWN_GRACE_S must be a number of seconds >= 0, got 'soon'", p.stderr
