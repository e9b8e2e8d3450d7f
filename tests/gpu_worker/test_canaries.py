"""The self-test's schedule: every canary at once, each in its caller's context (the real canaries' run
through the activity is test_activities')."""

from __future__ import annotations

import contextvars
import threading

import pytest

from gpu_worker import canaries

CALLER = contextvars.ContextVar("caller", default=None)


class _Ev:
    cuda, interpreter = False, True


def _passing(name: str) -> dict:
    ok = name in ("slow", "fast")
    reason = "" if ok else {"wrong": "wrong outputs", "cheat": "input-mutation: x"}[name]
    return {"compile_ok": True, "verify_ok": ok, "reason": reason, "rel_err": 0.0}


def test_the_canaries_run_at_once_in_the_callers_context(monkeypatch):
    """Four canaries meet at a barrier that one canary after another would never pass; each sees the
    context its caller set (there, an activity's: its heartbeats need it)."""
    meet = threading.Barrier(len(canaries.CANARIES), timeout=10)
    seen = []

    def classified(ev, name, hb):
        seen.append(CALLER.get())
        meet.wait()
        return _passing(name)

    monkeypatch.setattr(canaries, "_classified", classified)
    CALLER.set("activity")
    r = canaries.run_canaries(_Ev())
    assert r["ok"], r["problems"]
    assert seen == ["activity"] * len(canaries.CANARIES)
    assert set(r["canaries"]) == set(canaries.CANARIES)  # no timing canary without CUDA


def test_timing_canaries_measured_beside_a_failed_one_are_not_judged(monkeypatch):
    """On CUDA the timing canaries run beside the others; where a classification canary failed, the verdict
    names that failure alone and carries no timing figures."""
    ev = _Ev()
    ev.cuda = True
    timed = []

    def classified(ev, name, hb):
        r = _passing(name)
        if name == "wrong":
            r.update(verify_ok=True, reason="")  # the harness let a wrong kernel through
        return r

    monkeypatch.setattr(canaries, "_classified", classified)
    monkeypatch.setattr(canaries, "_timing_bench", lambda ev, name, hb: timed.append(name) or {"bench_ok": True})
    r = canaries.run_canaries(ev)
    assert sorted(timed) == sorted(canaries.TIMING_CANARIES)
    assert not r["ok"] and r["problems"] == ["the wrong canary passed verification"]
    assert not set(canaries.TIMING_CANARIES) & set(r["canaries"]) and r["timing"].startswith("skipped")


@pytest.mark.parametrize("broken", ["slow", "split8"])
def test_a_canary_that_raises_fails_the_self_test_run(monkeypatch, broken):
    """A canary's exception reaches the caller (Evaluator.selftest settles nothing; the background
    self-test counts it as failed), whichever thread it ran on."""
    ev = _Ev()
    ev.cuda = True

    def boom(*a):
        raise RuntimeError("the child died")

    def classified(ev, name, hb):
        return boom() if name == broken else _passing(name)

    monkeypatch.setattr(canaries, "_classified", classified)
    monkeypatch.setattr(canaries, "_timing_bench", lambda ev, name, hb: boom() if name == broken else {})
    with pytest.raises(RuntimeError, match="the child died"):
        canaries.run_canaries(ev)
