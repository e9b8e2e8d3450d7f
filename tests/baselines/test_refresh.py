"""Timing inputs that never repeat: each built-in problem's `refreshed` makes, from one input set, others of
the same distribution (every tensor's values the same multiset, shapes and dtypes kept) whose oracle outputs
differ, so a cache keyed on the inputs' contents misses; k = 0 is the set itself."""

from __future__ import annotations

import pytest
import torch

from baselines.problem import Problem
from baselines.registry import get_problem


@pytest.mark.parametrize("name", ["softmax", "kda", "mla_decode", "mla_prefill"])
def test_a_refreshed_set_is_a_valid_set_with_other_answers(name):
    p = get_problem(name)
    shape = p.cpu_shape
    assert p.refresh_count(shape) > 1
    x = p.make_inputs(shape, p.distributions[0], seed=4, device="cpu", cpu=True)
    assert p.refreshed(x, 0) is x
    ref = p.oracle(x)
    for k in (1, p.refresh_count(shape) - 1):
        y = p.refreshed(x, k)
        assert y.keys() == x.keys()
        for n, v in x.items():
            if isinstance(v, torch.Tensor):
                assert y[n].shape == v.shape and y[n].dtype == v.dtype, n
                assert torch.equal(torch.sort(y[n].reshape(-1)).values, torch.sort(v.reshape(-1)).values), n
        got = p.oracle(y)
        assert any(not torch.allclose(got[o], ref[o]) for o in ref), (name, k)


def test_a_problem_without_refreshes_times_its_own_sets():
    assert Problem().refresh_count(None) == 1
    x = {"x": torch.ones(3)}
    assert Problem().refreshed(x, 0) is x
