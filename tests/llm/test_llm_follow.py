"""A run one can follow: `watch` shows each model turn as it happens (tools, verdicts, tokens), and an
endpoint that is down shows in `watch`, in `status` (since when, which attempt) and in one worker log line
per retry instead of a traceback. Whole runs on the dev server against the scripted endpoint."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys

from tests.llm.kernels import LADDER, softmax_kernel
from tests.llm.script import TurnScript, turn
from tests.llm.server import ChatServer
from tests.workflows.helpers import start, workers
from workflows.contracts import RunSpec


def submit(i: int):
    return ("submit_kernel", {"source": softmax_kernel(**LADDER[i]), "rationale": f"step {i}"})


def slow(item, delay=0.4):
    def f(body):
        r = item(body)
        r.delay = delay
        return r
    return f


async def pending_attempt(h, n: int, timeout: float = 30.0) -> None:
    """Until the run's pending llm_turn activity is at attempt n."""
    async def poll():
        while True:
            pending = (await h.describe()).raw_description.pending_activities
            if pending and pending[0].attempt >= n:
                return
            await asyncio.sleep(0.1)
    await asyncio.wait_for(poll(), timeout)


async def test_watch_status_and_the_log_follow_turns_and_an_endpoint_outage(env, store, llm_env, caplog):
    from cli.query import watch

    caplog.set_level(logging.DEBUG, logger="temporalio")
    script = TurnScript([slow(turn(("read_baseline", {}), completion_tokens=41)), slow(turn(submit(0))),
                         slow(turn(("compile", {}))), slow(turn(submit(1)))])
    server = ChatServer(script)  # bound, not listening yet: the endpoint is down
    llm_env(server)
    out = io.StringIO()
    async with workers(env.client):
        h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 2}), "llm-follow")
        watching = asyncio.create_task(watch(env.client, h.id, interval=0.1, out=out))
        await pending_attempt(h, 4)  # attempts at 0, 1 and 3 s have failed
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "status", h.id, "--address", env.client.service_client.config.target_host,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        status, err = await cli.communicate()
        with server:
            res = await h.result()
            await watching
    status = status.decode()
    assert cli.returncode == 0, err.decode()
    assert "turn 1: asked at" in status and "waiting for the model" in status, status
    assert re.search(r"model endpoint unreachable since \d\d:\d\d:\d\d UTC: [3-9] attempts failed, the last with: "
                     r"model endpoint .* connection failed: .*; attempt [4-9] of 25 at \d\d:", status), status
    shown = out.getvalue()
    for n in (1, 2, 3):  # one line per failed attempt
        assert shown.count(f": {n} attempt{'s' if n > 1 else ''} failed, the last with: ") == 1, shown
    # each turn as it happens: its tools and tokens, then each verdict
    assert f"turn 1: read_baseline ({server.turns()[0].usage['prompt_tokens']:,} in / 41 out tokens)" in shown, shown
    lines = shown.splitlines()
    first = next(i for i, ln in enumerate(lines) if "turn 1: read_baseline" in ln)
    assert lines[first + 1].strip().startswith("read_baseline: ") and "characters" in lines[first + 1]
    assert any(ln.strip().startswith("submit_kernel: iteration 1: ") for ln in lines), shown
    assert any("compile: ERROR compile needs `source`" in ln for ln in lines), shown
    assert res.iterations == 2
    # the worker log: one line per failed attempt, no traceback
    retries = [r for r in caplog.records if "retried by Temporal" in r.getMessage()]
    assert len(retries) >= 3 and all("connection failed" in r.getMessage() for r in retries)
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO and "llm_turn" in str(r.__dict__))


def test_watch_says_a_turn_is_waiting_for_a_slow_model_once():
    from cli.llm_view import TurnPrinter
    from workflows.contracts import CallView, TurnView

    p = TurnPrinter(wait_note=15)
    asked = TurnView(turn=3, asked_at=1000.0)
    assert p.new_lines([asked], now=1010.0) == []  # a turn answered within seconds prints once, when answered
    (waiting,) = p.new_lines([asked], now=1016.0)
    assert waiting.startswith("turn 3: asked at ") and waiting.endswith("waiting for the model")
    assert p.new_lines([asked], now=1100.0) == []
    replied = asked.model_copy(update={"replied": True, "tokens_in": 1200, "tokens_out": 30,
                                       "calls": [CallView(name="compile")]})
    assert p.new_lines([replied], now=1101.0) == ["turn 3: compile (1,200 in / 30 out tokens)"]
    done = replied.model_copy(update={"calls": [CallView(name="compile", verdict="compiled (interpreter)")]})
    assert p.new_lines([done], now=1102.0) == ["  compile: compiled (interpreter)"]
    assert p.new_lines([done], now=1103.0) == []


async def test_watch_shows_the_turns_of_a_run_that_ended_before_it_looked(env, store, llm_env):
    # a fast endpoint's run can end between two polls (or before watch starts): its last turns still show
    from cli.query import watch

    script = TurnScript([turn(("read_baseline", {})), turn(submit(1))])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 1}),
                            "llm-watch-late")
            await h.result()
            shown = io.StringIO()
            res = await watch(env.client, h.id, out=shown)
    lines = shown.getvalue().splitlines()
    assert res.iterations == 1
    assert any(ln.startswith("      turn 1: read_baseline (") for ln in lines), lines
    assert any(ln.startswith("      turn 2: submit_kernel (") for ln in lines), lines
    assert any(ln.startswith("        submit_kernel: iteration 1: ") for ln in lines), lines
