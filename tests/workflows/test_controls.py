"""A run's controls sent as signals, as the plain temporal CLI sends them (any JSON, no answer): each one acts,
or is refused with why in the run's status and details; nothing is dropped without a trace."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from tests.conftest import temporal_path
from tests.workflows.helpers import run_id, until, workers
from workflows import controls
from workflows.contracts import Budget, RunResult, Used
from workflows.optimization import KernelOptimization


def test_a_budget_change_applies_only_the_fields_it_names_or_is_refused_with_why():
    budget, used = Budget(iterations=30, hours=2), Used(iterations=12)
    assert controls.budget_after(budget, used, {"iterations": 40}, False) == Budget(iterations=40, hours=2)
    for change, why in (({"iterations": -3}, "invalid budget change: iterations: budget iterations must be positive"),
                        ({"iterations": 5}, "iterations 5 is below the 12 already run"),
                        ({"iters": 5}, "unknown field 'iters'"),
                        (None, "invalid budget change: expected .*, got no input"),
                        ({}, "set_budget needs at least one of iterations")):
        with pytest.raises(controls.Refused, match=why):
            controls.budget_after(budget, used, change, False)
    with pytest.raises(controls.Refused, match="the run has finished"):
        controls.budget_after(budget, used, {"iterations": 40}, True)


def test_the_prompt_cap_is_a_whole_number_of_at_least_2000_on_a_running_run():
    assert controls.context_tokens(8000, False) == 8000
    for bad in (1999, 2000.0, True, "8000"):
        with pytest.raises(controls.Refused, match="context_tokens must be a whole number of at least 2000"):
            controls.context_tokens(bad, False)
    with pytest.raises(controls.Refused, match="the run has finished"):
        controls.context_tokens(8000, True)


def test_hints_and_stops_take_their_documented_bodies_only():
    assert controls.hint_text({"text": " BLOCK_N=1024 "}) == "BLOCK_N=1024"
    for raw in ("BLOCK_N=1024", {"txt": "x"}, {"text": "  "}, None):
        with pytest.raises(controls.Refused, match=r'invalid hint: .*expected \{"text": "..."\}'):
            controls.hint_text(raw)
    assert controls.stop_request(None).reason == "operator"
    assert controls.stop_request({"reason": "done"}).reason == "done"
    with pytest.raises(controls.Refused, match="invalid stop"):
        controls.stop_request({"reason": 5})
    with pytest.raises(controls.Refused, match=r'invalid stop: .*"now": true\|false'):
        controls.stop_request({"now": "soon"})
    now = controls.stop_request({"reason": "gpu gone", "now": True})
    assert now.now and not controls.stop_request(None).now
    # a later plain stop changes the reason; the stop still cancels what runs rather than waiting for it
    later = controls.later_stop(now, controls.stop_request({"reason": "really"}))
    assert later.reason == "really" and later.now
    assert controls.later_stop(controls.stop_request(None), now) == now
    assert "set_context_tokens is an update" in controls.unknown_signal("set_context_tokens")
    kept = []
    for i in range(controls.REFUSALS_KEPT + 2):
        kept = controls.note_refusal(kept, f"t{i}", "hint", "why")
    assert len(kept) == controls.REFUSALS_KEPT and kept[-1] == f"t{controls.REFUSALS_KEPT + 1} hint: why"


async def test_plain_cli_signals_act_or_are_refused_in_the_run_s_status(env, store, capsys):
    """Started, steered and stopped with the temporal binary alone: a set_budget signal changes the budget;
    a bad budget, a hint without its {"text": ...} body or naming no knob, and a misspelt signal name are each
    refused with why, in the status query (and `marathon status`) and the Web UI's details; the run has its
    summary in the memo."""
    from cli import main

    address = env.client.service_client.config.target_host
    wid = run_id("sig")

    def temporal(*a):
        return subprocess.run([temporal_path(), "workflow", *a, "--address", address, "--workflow-id", wid],
                              capture_output=True, text=True, timeout=60)

    async def signal(name, body=None):
        p = await asyncio.to_thread(temporal, "signal", "--name", name, *(["--input", body] if body else []))
        assert p.returncode == 0, p.stderr

    async with workers(env.client):
        p = await asyncio.to_thread(temporal, "start", "--type", "KernelOptimization", "--task-queue", "marathon-agent",
                                    "--input", '{"problem":"softmax","budget":{"iterations":4000}}')
        assert p.returncode == 0, p.stderr
        h = env.client.get_workflow_handle(wid, result_type=RunResult)
        await until(lambda s: s.iteration >= 1, h)
        await signal("set_budget", '{"iterations": 4100, "hours": 3}')
        st = await until(lambda s: s.budget.iterations == 4100, h)
        assert st.budget.hours == 3 and st.refused == []
        await signal("set_budget", '{"iterations": -3}')
        await signal("hint", '"BLOCK_N=1024"')
        await signal("sett_budget", '{"iterations": 9}')
        st = await until(lambda s: len(s.refused) == 3, h)
        assert st.budget.iterations == 4100 and st.pending_hints == 0
        first, second, third = (r.split(" UTC ", 1)[1] for r in st.refused)
        assert first.startswith("set_budget: invalid budget change: iterations: budget iterations must be positive")
        assert second == """hint: invalid hint: expected {"text": "..."}, got 'BLOCK_N=1024'"""
        assert third.startswith("sett_budget: this run has no signal 'sett_budget'; its signals: stop, pause")
        meta = await h.query("__temporal_workflow_metadata")
        assert f"- refused: {st.refused[0]}" in meta.current_details
        assert (await (await h.describe()).memo()) == {"summary": "softmax: search policy, budget 4,000 iterations"}
        # a hint with its body but no knob of the search's space: the search would ignore it, the run says why
        await signal("hint", '{"text": "BLOK_N=1024"}')
        st = await until(lambda s: len(s.refused) == 4, h)
        assert st.refused[3].split(" UTC ", 1)[1] == "hint: softmax has no knob 'BLOK_N'; its knobs: " + ", ".join(
            search_space_of("softmax"))
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["status", wid, "--address", address]) == 0
        assert f"\nrefused: {st.refused[1]}\n" in capsys.readouterr().out
        await signal("stop")  # no input: the reason defaults
        res = await asyncio.wait_for(h.result(), 60)
    assert res.stopped_by == "stop-signal" and res.stop_reason == "operator"


def search_space_of(problem: str) -> list[str]:
    from baselines.registry import get_problem

    return list(get_problem(problem).knob_space())
