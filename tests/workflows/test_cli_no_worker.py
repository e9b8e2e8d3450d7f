"""With no worker, or one that has just stopped, nothing hangs: `start` warns that nothing will run the run,
`budget`, `status` and `report` answer in one line within seconds, `watch` says what it waits for."""

from __future__ import annotations

import asyncio
import io
import time
from contextlib import redirect_stderr

import pytest
import pytest_asyncio

from cli import main
from cli.server import connect_when_healthy, start_dev_server, stop_server
from tests.workflows.helpers import run_id
from tests.workflows.test_cli import free_port

SECONDS = 15  # "within a few seconds", with room for a loaded 2-core host


@pytest_asyncio.fixture(scope="module")
async def bare(tmp_path_factory):
    """A dev server of its own that no worker has ever polled (the shared one's pollers linger): (address, client)."""
    port = free_port()
    proc = start_dev_server(port, 0, tmp_path_factory.mktemp("bare") / "temporal.db", headless=True)
    try:
        client = await connect_when_healthy(f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}", client
    finally:
        stop_server(proc)


def timed(capsys, *argv) -> tuple[int, str, str, float]:
    capsys.readouterr()
    t0 = time.monotonic()
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err, time.monotonic() - t0


async def test_no_worker_start_warns_and_the_rest_answer_at_once(bare, capsys):
    address, client = bare
    wid = run_id("lonely")
    rc, out, err, _ = await asyncio.to_thread(timed, capsys, "start", "softmax", "--id", wid, "--address", address)
    assert rc == 0 and out.strip() == wid
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert warnings == [
        "warning: no worker is polling task queue marathon-agent: nothing runs this run until one starts "
        "(`marathon worker --role all`, or `--role agent` where GPU workers run elsewhere)",
        "warning: no GPU worker is polling task queue marathon-gpu: its candidates wait until one starts "
        "(`marathon worker --role gpu`)"], err
    for argv in (["budget", wid, "--iterations", "3"], ["status", wid], ["report", wid, "--out", "/nonexistent"]):
        rc, out, err, took = await asyncio.to_thread(timed, capsys, *argv, "--address", address)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and took < SECONDS, (argv, err, took)
        assert f"run '{wid}': no worker is polling task queue marathon-agent" in lines[0], lines
    rc, _, err, _ = await asyncio.to_thread(timed, capsys, "budget", wid, "--iterations", "3", "--address", address)
    assert err.strip().endswith("; nothing was changed"), err

    from cli.query import watch

    said = io.StringIO()
    with redirect_stderr(said), pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(watch(client, wid, interval=0.2, out=io.StringIO()), 3)
    assert said.getvalue().startswith(f"waiting: run '{wid}': no worker is polling task queue marathon-agent")


@pytest.mark.slow
async def test_a_worker_that_has_just_stopped_is_not_waited_for(bare, capsys):
    """The server lists a stopped worker's poller for minutes: status and budget give up after a few seconds
    with one line instead of waiting for an answer that cannot come, and a run started then is told that no
    worker took its first task."""
    from activities.worker import build_agent_worker
    from cli.workers import queue_pollers, shared_agent_queue

    address, client = bare
    wid = run_id("orphan")
    rc, *_ = await asyncio.to_thread(timed, capsys, "start", "softmax", "--id", wid, "--address", address)
    assert rc == 0
    async with build_agent_worker(client):
        async def polled():
            while not await queue_pollers(client, "marathon-agent", workflow=True):
                await asyncio.sleep(0.2)
        await asyncio.wait_for(polled(), 30)
        await asyncio.sleep(1.0)  # the run's first task is taken
        # a local-model demo started now is told that this worker may take its model's turns
        assert f"({client.identity})" in await shared_agent_queue(client)
    from cli.connection import ANSWER_TIMEOUT_S

    for argv, said in ((["status", wid], f"no worker answered within {ANSWER_TIMEOUT_S:g} s"),
                       (["budget", wid, "--iterations", "3"],
                        f"no worker took the budget change within {ANSWER_TIMEOUT_S:g} s")):
        rc, out, err, took = await asyncio.to_thread(timed, capsys, *argv, "--address", address)
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and said in lines[0], (argv, err, took)
        assert took < ANSWER_TIMEOUT_S + SECONDS, (argv, took)  # the wait for an answer, then one line
        # the advice is the one given where no worker polls at all: `--role agent` alone would leave the
        # run's candidates without a GPU worker on a one-host setup
        if argv[0] == "status":
            assert lines[0].endswith("start one with `marathon worker --role all` against this server "
                                     "(`--role agent` where GPU workers run elsewhere)"), lines
    await client.get_workflow_handle(wid).terminate("test over")
    # the stopped worker is still listed: a run started now is told that no worker took its first task
    assert await queue_pollers(client, "marathon-agent", workflow=True)
    later = run_id("orphan")
    rc, out, err, took = await asyncio.to_thread(timed, capsys, "start", "softmax", "--id", later, "--address", address)
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning: ")]
    assert rc == 0 and "no worker took this run's first task within 5 s" in warnings[-1], err
    await client.get_workflow_handle(later).terminate("test over")


@pytest.mark.slow
async def test_a_run_with_an_agent_worker_alone_says_that_no_gpu_worker_polls(bare, capsys):
    """The loop runs, its candidates wait: `status` and `watch` say that no GPU worker polls the run's GPU
    queue and what starts one, where before the run sat at "evaluating" without a word. (Last in the file:
    the agent worker's poller lingers on the server.)"""
    from activities.worker import build_agent_worker
    from cli.query import watch

    address, client = bare
    wid = run_id("agent-only")
    line = "waiting: no GPU worker is polling task queue marathon-gpu: its candidates wait until one starts"
    async with build_agent_worker(client):
        rc, *_ = await asyncio.to_thread(timed, capsys, "start", "softmax", "--id", wid, "--address", address)
        assert rc == 0
        rc, out, err, _ = await asyncio.to_thread(timed, capsys, "status", wid, "--address", address)
        assert rc == 0 and line in out, (out, err)
        said = io.StringIO()
        with redirect_stderr(said), pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(watch(client, wid, interval=0.2, out=io.StringIO()), 5)
        assert said.getvalue().count(line) == 1, said.getvalue()
    await client.get_workflow_handle(wid).terminate("test over")
