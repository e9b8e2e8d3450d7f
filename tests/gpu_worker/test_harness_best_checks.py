"""The checks only a would-be best gets (gpu_worker.harness.best_checks): verification at a random shape,
whose child compiles outside any device job."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import kernel, req


@pytest.mark.slow(40)
def test_verified_at_a_random_shape_on_request(judge, store):
    from baselines.problem import RANDOM_SHAPE
    from baselines.registry import get_problem

    p = get_problem("softmax")
    listed = (p.cpu_shape if judge.interpreter else p.shapes[0]).name  # where it expects to be verified
    cheat = req(store, kernel("listed_shape_only"))
    assert judge.verify(cheat).ok  # right there
    v = judge.verify(cheat.model_copy(update={"random_shape": True}))
    assert not v.ok and v.family == "shape-specific", v
    assert v.reason.startswith(f"shape-specific: correct at {listed}, not at {RANDOM_SHAPE}M="), v.reason

    honest = judge.verify(req(store, p.template()).model_copy(update={"random_shape": True}))
    assert honest.ok and honest.random_shape and honest.random_shape.startswith(RANDOM_SHAPE), honest
    assert f"random shape {honest.random_shape}: worst rel_err" in store.get_text(honest.log_key)
    assert not any(k[1].startswith(RANDOM_SHAPE) for k in judge.refs.children), "a random shape's reference child stays"


def test_a_child_loaded_for_another_shape_compiles_outside_any_device_job(judge, store, monkeypatch):
    # a waiting timing block waits for the running jobs: a compiler inside one would keep it waiting for seconds
    import contextlib
    import threading

    from baselines.registry import get_problem
    from gpu_worker.sandbox import Sandbox

    held, calls = [], []  # held: the threads inside a device job (spares take theirs on threads of their own)
    real_job, real_call = judge.turns.job, Sandbox.call

    @contextlib.contextmanager
    def job():
        with real_job():
            held.append(threading.get_ident())
            try:
                yield
            finally:
                held.remove(threading.get_ident())

    def call(sb, request, *a, **kw):
        calls.append((request.cmd, threading.get_ident() in held))
        return real_call(sb, request, *a, **kw)

    monkeypatch.setattr(judge.turns, "job", job)
    monkeypatch.setattr(Sandbox, "call", call)
    v = judge.verify(req(store, get_problem("softmax").template()).model_copy(update={"random_shape": True}))
    assert v.ok and v.random_shape, v
    compiles = [h for c, h in calls if c == "compile"]
    assert compiles and not any(compiles), calls  # the random shape's child compiled, with no turn
    assert all(h for c, h in calls if c == "verify"), calls


def test_the_next_listed_shape_is_prepared_once_after_a_first_verification(judge, monkeypatch):
    # the first would-be best's second verification finds the shape's reference ready (FLA autotuned there)
    from baselines.registry import get_problem
    from gpu_worker.harness.best_checks import shape_to_prepare
    from gpu_worker.harness.cases import other_shapes

    p = get_problem("kda")
    primary, nxt = p.shapes[0], other_shapes(p, p.shapes[0])[0]
    assert shape_to_prepare(p, primary, set()) == nxt
    assert shape_to_prepare(p, primary, {("kda", nxt)}) is None
    assert shape_to_prepare(get_problem("mla_prefill"), get_problem("mla_prefill").shapes[0], set()) is None

    if judge.interpreter:
        assert judge.best_checks.prepare_next_shape(p, primary, "c0") is None, "the CPU verifies at one shape"
    calls = []
    monkeypatch.setattr(judge.ctx, "cuda", True)
    monkeypatch.setattr(judge.best_checks, "prepared_shapes", set())
    monkeypatch.setattr(judge.refs, "reference", lambda problem, shape, cases, hb: calls.append((shape.name, cases)))
    t = judge.best_checks.prepare_next_shape(p, primary, "c1")
    t.join(10)
    assert calls == [(nxt, judge.ctx.cases(p, "c1"))]
    assert judge.best_checks.prepare_next_shape(p, primary, "c2") is None, "once per worker and shape"
    # a best verified at that shape next: the primary shape, serving already, is not prepared again
    assert judge.best_checks.prepare_next_shape(p, p.shape_named(nxt), "c1") is None and len(calls) == 1
