"""How many requests a candidate's evaluation makes of its children, counted on the interpreter's harness
with real sandbox children: a loser (rejected at verification), a passing candidate (compiled, verified and
benchmarked against a best) and a would-be best (also re-measured in a fresh process and verified at another
shape and a random one). Every request is a round trip, each queued again for the device's turn on a GPU,
so the counts are held to ceilings: a stage is one request of the candidate's child, not one per step."""

from __future__ import annotations

import collections

import pytest

from tests.gpu_worker.harnesses import canary, req
from workflows.contracts import BenchRequest, BestRef

# the candidate children's requests (the best's child in a benchmark included), at most, per candidate kind
# on the interpreter (a GPU adds each new child's context and Triton keys). A load stages the compile's case
# in the same request. Verification is three: the cases' inputs staged (host work), the stage's one
# `verify` (one device job), the late-write check and files (host work); it was thirteen with a request per
# step (then a loser made 17, a passing candidate 41, a would-be best 87). In a benchmark, each
# distribution's timed outputs are downloaded with the candidate's host latency, in its timing block (no
# request and no device job of their own); the timed blocks are still a request each, interleaved with the
# baseline's and the best's.
LIMITS = {"loser": 6, "verify": 3, "passing": 27, "best": 54}


class Counter:
    """Sandbox.call, counted per child role and command."""

    def __init__(self, monkeypatch):
        from gpu_worker.sandbox import Sandbox

        self.calls: list[tuple[str, str]] = []
        real = Sandbox.call

        def call(sb, request, *a, **kw):
            self.calls.append((sb.role, request.cmd))
            return real(sb, request, *a, **kw)

        monkeypatch.setattr(Sandbox, "call", call)

    def candidate(self) -> int:
        return sum(1 for role, _ in self.calls if role == "candidate")

    def commands(self) -> dict:
        return dict(collections.Counter(c for role, c in self.calls if role == "candidate"))

    def reset(self) -> None:
        self.calls.clear()


def _unique(source: str, tag: str) -> str:
    # a candidate of its own (its own source key), so that no child of an earlier test is handed on to it
    return f"{source}\n# round-trip count: {tag}\n"


@pytest.fixture
def counter(monkeypatch):
    return Counter(monkeypatch)


@pytest.mark.slow(20)
def test_a_loser_makes_few_round_trips(ev, store, counter, monkeypatch):
    from gpu_worker.harness import context

    source = _unique(canary("wrong"), "loser")
    checked, check = [], context.check_source
    monkeypatch.setattr(context, "check_source", lambda s, p: (checked.append(s == source), check(s, p))[1])
    r = req(store, source)
    assert ev.compile(r).ok
    v = ev.verify(r)
    assert not v.ok and v.reason.startswith(("wrong", "non-finite")), v
    assert counter.candidate() <= LIMITS["loser"], counter.commands()
    assert checked == [True]  # the static rules read the source once, at its first stage


def test_verification_is_one_request_of_the_candidate_child(ev, store, counter, monkeypatch):
    """One request, and so one untimed device job of the candidate's child for the stage (on a GPU each job
    waits its turn behind the timing blocks; there were eleven: the upload, each step, the download)."""
    r = req(store, _unique(canary("fast"), "verify"))
    assert ev.compile(r).ok
    counter.reset()
    jobs, job = [], ev.turns.job

    def counted_job():
        jobs.append(1)
        return job()

    monkeypatch.setattr(ev.turns, "job", counted_job)
    v = ev.verify(r)
    assert v.ok, v.reason
    cmds = counter.commands()
    assert cmds.get("verify") == 1 and "prepare" not in cmds, cmds
    assert counter.candidate() <= LIMITS["verify"], cmds
    assert len(jobs) == 1, jobs


@pytest.mark.slow(65)
def test_round_trips_per_candidate_kind(ev, store, counter):
    """Passing and would-be best: the counts, printed for the record, each within its ceiling."""
    r = req(store, _unique(canary("fast"), "passing"))
    best = BestRef(candidate_id="slow", source_key=store.put_text(canary("slow")), speedup=1.0, time_ms=1.0,
                   baseline_ms=1.0, iteration=1, interpreter=True)
    assert ev.compile(r).ok and ev.verify(r).ok
    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key,
                                  best=best))
    assert b.ok, b.reason
    passing = counter.candidate()
    passing_cmds = counter.commands()
    again = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key,
                                      best=best, fresh_process=True))
    assert again.ok, again.reason
    # as the evaluation workflow asks under the interpreter (which lists no other shapes): a random shape
    at = ev.verify(r.model_copy(update={"random_shape": True}))
    assert at.ok, at.reason
    best_total = counter.candidate()
    print(f"round trips: passing {passing} {passing_cmds}; would-be best {best_total} {counter.commands()}")
    assert passing <= LIMITS["passing"], passing_cmds
    assert best_total <= LIMITS["best"], counter.commands()
