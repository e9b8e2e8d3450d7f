"""What the stages share (gpu_worker.harness.context): a source past the static rules is checked once."""

from __future__ import annotations

import pytest

from gpu_worker.harness import context
from gpu_worker.sandbox import Rejection
from tests.gpu_worker.harnesses import canary


@pytest.fixture
def checks(monkeypatch):
    seen = []
    real = context.check_source

    def counted(source, problem):
        seen.append((source, problem))
        return real(source, problem)

    monkeypatch.setattr(context, "check_source", counted)
    return seen


def test_a_source_that_passed_is_not_checked_again(checks):
    passed = context.RulesPassed()
    src = canary("fast")
    for _ in range(3):
        passed.check(src, "softmax")
    assert len(checks) == 1
    passed.check(src + "\n# another text\n", "softmax")  # another text: checked
    passed.check(src, "kda")  # another problem: checked
    assert len(checks) == 3


def test_a_refused_source_is_refused_every_time_with_its_reason(checks):
    passed = context.RulesPassed()
    bad = canary("fast") + "\nimport socket\n"
    for _ in range(2):
        with pytest.raises(Rejection) as e:
            passed.check(bad, "softmax")
        assert e.value.stage == "rules" and "socket" in e.value.reason
    assert len(checks) == 2


def test_the_memory_of_passes_is_bounded(checks):
    passed = context.RulesPassed(limit=2)
    a, b, c = (canary("fast") + f"\n# {i}\n" for i in range(3))
    for s in (a, b, c, a):  # a was forgotten when c came
        passed.check(s, "softmax")
    assert len(checks) == 4
    passed.check(c, "softmax")  # still kept
    assert len(checks) == 4
