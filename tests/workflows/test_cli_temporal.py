"""The plain temporal CLI drives the same workflow as marathon: its start, query, update and signal commands,
bad input that fails the run with one clear message, and the commands `marathon start` prints and docs/cli.md shows."""

from __future__ import annotations

import asyncio
import re
import subprocess

import pytest

from tests.conftest import temporal_path
from tests.workflows.helpers import run_id, workers
from workflows.contracts import RunResult


async def test_plain_temporal_cli_drives_the_workflow(env, store):
    address = env.client.service_client.config.target_host
    wid = run_id("tcli")
    t = [temporal_path()]
    common = ["--address", address, "--workflow-id", wid]

    def run(*a):
        return subprocess.run(t + list(a), capture_output=True, text=True, timeout=60)

    async with workers(env.client):
        p = await asyncio.to_thread(run, "workflow", "start", "--type", "KernelOptimization", "--task-queue",
                                    "marathon-agent", "--address", address, "--workflow-id", wid, "--input",
                                    '{"problem":"softmax","budget":{"iterations":30}}')
        assert p.returncode == 0, p.stderr
        await asyncio.sleep(1)
        q = await asyncio.to_thread(run, "workflow", "query", *common, "--name", "status", "-o", "json")
        assert q.returncode == 0 and '"phase"' in q.stdout
        u = await asyncio.to_thread(run, "workflow", "update", "execute", *common, "--name", "set_budget",
                                    "--input", '{"iterations": -5}')
        assert u.returncode != 0 and "must be positive" in (u.stderr + u.stdout)
        u = await asyncio.to_thread(run, "workflow", "update", "execute", *common, "--name", "set_budget",
                                    "--input", '{"iterations": 35}')
        assert u.returncode == 0, u.stderr
        s = await asyncio.to_thread(run, "workflow", "signal", *common, "--name", "stop", "--input",
                                    '{"reason": "temporal cli"}')
        assert s.returncode == 0, s.stderr
        res = await env.client.get_workflow_handle(wid, result_type=RunResult).result()
    assert res.stopped_by == "stop-signal"


@pytest.mark.parametrize("payload, message", [
    ('{"problem": "softmax", "budgett": {}}', "invalid run spec: unknown field 'budgett'"),
    ('{"problem": "softmax", "budget": {"iterations": -3}}', "budget iterations must be positive"),
    ('[1, 2]', "invalid run spec"),
    ('{"problem": "nosuch"}', "unknown problem 'nosuch'; known problems:"),
    ('{"problem": "softmax", "shape": "huge"}', "problem softmax has no shape 'huge'"),
    ('{"problem": "softmax", "start_kernel": "%s"}' % ("0" * 64), "start_kernel %s: not in the artifact store"
     % ("0" * 64)),
    ('{"problem": "softmax", "start_kernel": "nokey"}', "start_kernel must be an artifact key"),
])
async def test_bad_input_through_the_plain_temporal_cli_fails_the_run_clearly(env, store, payload, message, capsys):
    """No validation on the client side here: the workflow itself must fail with one clear message
    instead of retrying its first task forever or pausing at the first proposal; `marathon status` and
    `marathon watch` say that it failed, and why, alike, with exit status 1 (a worker is up to answer)."""
    from temporalio.client import WorkflowFailureError

    from cli import main

    address = env.client.service_client.config.target_host
    wid = run_id("badin")
    async with workers(env.client):
        p = await asyncio.to_thread(subprocess.run, [temporal_path(), "workflow", "start", "--address", address,
                                                     "--type", "KernelOptimization", "--task-queue",
                                                     "marathon-agent", "--workflow-id", wid, "--input", payload],
                                    capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        with pytest.raises(WorkflowFailureError) as e:
            await asyncio.wait_for(env.client.get_workflow_handle(wid).result(), 30)
        capsys.readouterr()
        said = {}
        for command in ("status", "watch"):  # both say it the same way
            rc = await asyncio.to_thread(main, [command, wid, "--address", address])
            said[command] = (rc, capsys.readouterr().out.strip().splitlines())
    assert message in str(e.value.cause), str(e.value.cause)
    rc, out = said["status"]
    assert rc == 1 and len(out) == 1 and out[0].startswith(f"run {wid} failed: ") and message in out[0], out
    rc, out = said["watch"]
    assert rc == 1 and out[-1] == said["status"][1][0], out


def docs_temporal_lines() -> list[str]:
    """The plain temporal CLI commands of docs/cli.md's section on it, continuation lines joined."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    block = text.split("## The plain temporal CLI\n", 1)[1].split("```bash\n", 1)[1]
    return [ln for ln in block.split("```", 1)[0].replace("\\\n", " ").splitlines() if ln.strip()]


async def test_the_temporal_cli_hints_printed_and_in_the_cli_docs_work(env, store, capsys):
    """Every command `marathon start` prints for the plain temporal CLI, and every one docs/cli.md shows, run
    with the temporal binary against the dev server, does what it says."""
    import shlex

    from cli import main
    from workflows.optimization import KernelOptimization

    address = env.client.service_client.config.target_host
    wid, wid2 = run_id("thint"), run_id("docs")

    def temporal(line: str, extra=()) -> subprocess.CompletedProcess:
        argv = shlex.split(line)
        assert argv[0] == "temporal", line
        return subprocess.run([temporal_path()] + argv[1:] + list(extra), capture_output=True, text=True,
                              timeout=60)

    async with workers(env.client):
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["start", "softmax", "--iterations", "4000", "--id", wid,
                                              "--address", address]) == 0
        out = capsys.readouterr()
        # the workers of this process may log their first activities while start waits for the first task
        printed = [ln for ln in out.out.splitlines() if not re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[", ln)]
        assert printed == [wid], out.out
        head, *hints = out.err.strip().splitlines()
        assert head == "the plain temporal CLI drives it too:" and len(hints) == 7, out.err
        h = env.client.get_workflow_handle(wid, result_type=RunResult)
        for line in hints:
            r = await asyncio.to_thread(temporal, line)
            assert r.returncode == 0, (line, r.stdout, r.stderr)
            if "--name status" in line:
                assert "Query result:" in r.stdout and wid in r.stdout, r.stdout
            if "--name set_budget" in line:
                assert (await h.query(KernelOptimization.status)).budget.iterations == 8000
            if "--name hint" in line:
                assert "BLOCK_N=" in line or "VARIANT=" in line
            if "--name pause" in line:
                async def paused(want):
                    while (await h.query(KernelOptimization.status)).paused != want:
                        await asyncio.sleep(0.1)
                await asyncio.wait_for(paused(True), 30)
            if "--name resume" in line:
                await asyncio.wait_for(paused(False), 30)
        res = await asyncio.wait_for(h.result(), 60)
        assert res.stopped_by == "stop-signal" and res.stop_reason == "done for today"

        shown = [ln.replace("run1", wid2) for ln in docs_temporal_lines()]
        assert [shlex.split(ln)[2] for ln in shown] == ["start", "query", "update", "signal", "signal", "list"]
        for line in shown:
            r = await asyncio.to_thread(temporal, line, ["--address", address])
            assert r.returncode == 0, (line, r.stdout, r.stderr)
        res2 = await asyncio.wait_for(env.client.get_workflow_handle(wid2, result_type=RunResult).result(), 60)
        assert res2.stopped_by == "stop-signal" and res2.stop_reason == "done for today"
        # the docs' start gives the run the Web UI's Summary: the summary line that `marathon start` sets
        first = min([w async for w in env.client.list_workflows(f"WorkflowId = '{wid2}'")], key=lambda w: w.start_time)
        desc = await env.client.get_workflow_handle(wid2, run_id=first.run_id).describe()
        line = "softmax: search policy, budget 30 iterations"
        assert await desc.static_summary() == (await desc.memo())["summary"] == line
