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


def test_marathon_bench_passes_its_options_through(monkeypatch):
    import asyncio

    import gpu_worker.scoreboard as sb
    from workflows.cli import build_parser

    seen = {}
    monkeypatch.setattr(sb, "run", lambda names, best, primary_only, out: seen.update(
        names=names, best=best, primary_only=primary_only, out=str(out)) or [])
    args = build_parser().parse_args(["bench", "kda@2,3", "mla_decode", "--best", "kda=abc", "--primary-only",
                                      "--out", "/tmp/sb"])
    assert asyncio.run(args.fn(args)) == 0
    assert seen == {"names": ["kda@2,3", "mla_decode"], "best": {"kda": "abc"}, "primary_only": True,
                    "out": "/tmp/sb"}


def test_bench_refuses_a_shape_number_the_problem_lacks_before_anything_runs():
    with pytest.raises(SystemExit, match="0 B1 T8192 H32 D128"):
        main(["kda@0,9"])
