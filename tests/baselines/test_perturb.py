"""Timing inputs seen once (Problem.perturbed) and parameters that vary (baselines.perturb): each problem
makes, from a pool set and a generator, valid inputs of the same distribution (shapes, dtypes, ranges,
normalisation and scales kept) whose answers are far from the pool set's, leaving the pool set as it is;
a KernelBench file's Model parameters are its initialisation scaled and shifted per case."""

from __future__ import annotations

import pytest
import torch

from baselines.problem import Problem, rel_rms
from baselines.registry import get_problem


def _draw(p, dist, seed=4):
    x = p.make_inputs(p.cpu_shape, dist, seed=seed, device="cpu", cpu=True)
    pristine = {k: v.clone() for k, v in x.items()}
    y = p.perturbed(x, torch.Generator().manual_seed(seed + 100), dist)
    for k, v in x.items():
        assert torch.equal(v, pristine[k]), f"perturbed changed the pool set's {k}"
    return x, y


@pytest.mark.parametrize("name", ["softmax", "kda", "mla_decode", "mla_prefill"])
def test_a_perturbed_set_is_a_valid_set_of_its_distribution_with_other_answers(name):
    p = get_problem(name)
    for dist in p.distributions:
        x, y = _draw(p, dist)
        assert y.keys() == x.keys()
        for n, v in x.items():
            assert y[n].shape == v.shape and y[n].dtype == v.dtype, (dist, n)
            assert not torch.equal(torch.sort(y[n].reshape(-1)).values, torch.sort(v.reshape(-1)).values), (dist, n)
            # the same scale: a kernel's numerics (overflow, precision) meet what the distribution promises
            ratio = float(y[n].float().std() / v.float().std())
            assert 0.8 < ratio < 1.25, (dist, n, ratio)
        ref, got = p.oracle(x), p.oracle(y)
        moved = min(rel_rms(ref[o], got[o]) for o in ref)
        assert moved > 0.3, (dist, moved)  # far beyond every tolerance: a stale answer cannot pass for it
        with pytest.raises(ValueError, match="no distribution"):
            p.perturbed(x, torch.Generator().manual_seed(0), "nonesuch")


def test_kda_inputs_stay_in_their_ranges():
    p = get_problem("kda")
    for dist in p.distributions:
        _, y = _draw(p, dist)
        for n in ("q", "k"):
            assert torch.allclose(y[n].norm(dim=-1), torch.ones(()), atol=1e-5), (dist, n)
        assert (y["g"] <= 0).all() and torch.isfinite(y["g"]).all(), dist
        assert ((y["beta"] > 0) & (y["beta"] < 1)).all(), dist
        assert y["initial_state"].dtype == torch.float32 and y["g"].dtype == torch.float32
    # each distribution keeps its decay: mild ~ -0.07 nats per step, strong ~ -8
    mild, strong = (_draw(p, d)[1]["g"].mean().item() for d in ("mild", "strong"))
    assert -0.2 < mild < -0.02 and -10 < strong < -6, (mild, strong)


def test_the_default_is_relative_noise_on_float_tensors():
    """Signs and zeros kept (a positive input stays positive, a 0/1 mask keeps its zeros), integers as
    they are, every float element changed."""
    x = {"a": torch.rand(50, 7) + 0.01, "m": (torch.rand(50) > 0.5).float(), "i": torch.arange(5), "s": 3}
    y = Problem().perturbed(x, torch.Generator().manual_seed(1), "any")
    assert (y["a"] > 0).all() and (y["a"] != x["a"]).all()
    assert torch.equal(y["m"] == 0, x["m"] == 0) and torch.equal(y["i"], x["i"]) and y["s"] == 3
    assert 0.1 < float((y["a"] / x["a"]).log().std()) < 0.4  # about RELATIVE = 0.25


def test_parameters_are_scaled_and_shifted_so_none_is_a_no_op():
    from baselines.perturb import vary_parameter

    g = torch.Generator().manual_seed(3)
    ones, zeros = vary_parameter(torch.ones(1000), g), vary_parameter(torch.zeros(1000), g)
    assert (ones > 0).all() and 0.2 < float(ones.std()) < 0.5  # a weight of ones: other positive weights
    assert 0.05 < float(zeros.std()) < 0.2  # a bias of zeros: a bias
    mask = torch.tril(torch.ones(8, 8))
    assert torch.equal(vary_parameter(mask, g) == 0, mask == 0)  # a 0/1 buffer keeps its zeros
    steps = torch.tensor(5)
    assert vary_parameter(steps, g) is steps  # integers (num_batches_tracked) as they are
    w = torch.randn(1000)
    assert 0.05 < rel_rms(w, vary_parameter(w, g)) < 0.6
