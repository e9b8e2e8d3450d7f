"""`marathon hint` checks a search run's hint against its knob space, read from the run's history: where that
problem cannot be loaded here (a run the plain temporal CLI started on an unknown problem, failed at once) the
command says so in one line instead of a traceback."""

from __future__ import annotations

import pytest

from cli.errors import UsageError
from cli.spec import check_hint
from workflows.contracts import RunSpec


def test_a_hint_to_a_run_whose_problem_cannot_be_loaded_is_one_usage_error():
    spec = RunSpec.model_validate({"problem": "nosuch"})  # valid as a spec: only the workflow checks the name
    with pytest.raises(UsageError, match="the run's problem cannot be loaded here .*unknown problem 'nosuch'"):
        check_hint(spec, "BLOCK_N=64")


def test_a_hint_to_a_known_problem_is_still_checked_against_its_knobs():
    spec = RunSpec.model_validate({"problem": "softmax"})
    check_hint(spec, "BLOCK_N=1024")
    with pytest.raises(UsageError, match="softmax has no knob 'FOO'"):
        check_hint(spec, "FOO=1")
