"""`marathon bench` targets: a problem, or some of its shapes by number (one problem's rows on several GPUs)."""

import pytest

from baselines.registry import UnknownProblem
from gpu_worker.scoreboard import main, parse_target


def test_parse_target():
    assert parse_target("kda") == ("kda", None)
    assert parse_target("kda@2,3") == ("kda", [2, 3])
    with pytest.raises(SystemExit, match="PROBLEM@I,J"):
        parse_target("kda@two")


def test_bench_refuses_unknown_problem_before_anything_runs():
    with pytest.raises(UnknownProblem, match="no_such_problem"):
        main(["no_such_problem@0"])
