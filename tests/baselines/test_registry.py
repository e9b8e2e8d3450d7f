"""baselines.registry: a tool's problem, shape and distribution arguments, each wrong one a clear error."""

from __future__ import annotations

import pytest

from baselines.problem import UnknownProblem
from baselines.registry import problem_at


def test_the_shape_by_index_and_the_first_distribution_by_default():
    p, shape, dist = problem_at("mla_decode", 1)
    assert p.name == "mla_decode" and shape is p.shapes[1] and dist == p.distributions[0]
    assert problem_at("mla_decode", 0, "peaked")[2] == "peaked"


@pytest.mark.parametrize("args, message", [
    (("no_such_problem", 0), "unknown problem 'no_such_problem'"),
    (("mla_decode", 2), "--shape 2: mla_decode has shapes 0..1"),
    (("mla_decode", -1), "--shape -1: mla_decode has shapes 0..1"),
    (("mla_decode", 0, "flat"), "--dist flat: mla_decode's distributions are unit, small, peaked"),
])
def test_each_wrong_argument_is_one_clear_error(args, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")) as e:
        problem_at(*args)
    assert isinstance(e.value, UnknownProblem) == (args[0] == "no_such_problem")
