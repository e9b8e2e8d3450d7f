"""The run's updates sent by the plain temporal CLI with input of the wrong JSON type (a string where an object
or a number belongs): rejected with what the update expects, as the same input sent as a signal is refused,
never with the SDK's "Failed decoding arguments"."""

from __future__ import annotations

import asyncio
import subprocess

from tests.conftest import temporal_path
from tests.workflows.helpers import run_id, until, workers
from workflows.contracts import RunResult


async def test_an_update_of_the_wrong_json_type_is_rejected_with_what_it_expects(env, store):
    address = env.client.service_client.config.target_host
    wid = run_id("upd")

    def temporal(*a):
        return subprocess.run([temporal_path(), "workflow", *a, "--address", address, "--workflow-id", wid],
                              capture_output=True, text=True, timeout=60)

    async def update(name, body):
        p = await asyncio.to_thread(temporal, "update", "execute", "--name", name, "--input", body)
        return p.returncode, p.stdout + p.stderr

    async with workers(env.client):
        p = await asyncio.to_thread(temporal, "start", "--type", "KernelOptimization", "--task-queue", "marathon-agent",
                                    "--input", '{"problem":"softmax","budget":{"iterations":4000}}')
        assert p.returncode == 0, p.stderr
        h = env.client.get_workflow_handle(wid, result_type=RunResult)
        await until(lambda s: s.iteration >= 1, h)
        for name, body, expected in (
                ("set_budget", '"sixty"', """invalid budget change: expected {"iterations": N, ...}, got 'sixty'"""),
                ("set_budget", "[60]", "invalid budget change: expected"),
                ("set_context_tokens", '"8000"', "context_tokens must be a whole number of at least 2000, got '8000'")):
            rc, out = await update(name, body)
            assert rc != 0 and expected in out and "Failed decoding arguments" not in out, out
        rc, out = await update("set_budget", '{"iterations": 4100}')  # a well-formed one still applies
        assert rc == 0, out
        await until(lambda s: s.budget.iterations == 4100, h)
        await h.signal("stop")
        await asyncio.wait_for(h.result(), 60)
