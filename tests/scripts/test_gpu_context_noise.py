"""scripts/gpu_context_noise.py: the parts that decide its figures, without a GPU."""

import pytest


@pytest.fixture()
def noise(load_script):
    return load_script("gpu_context_noise")


def test_a_repetition_overlaps_a_creation_only_when_their_intervals_meet(noise):
    spans = [(10.0, 12.0), (20.0, 21.0)]
    assert noise.overlaps((11.5, 11.6), spans)
    assert noise.overlaps((9.0, 10.5), spans) and noise.overlaps((20.9, 30.0), spans)
    assert not noise.overlaps((12.0, 13.0), spans)  # touching at an end is no overlap
    assert not noise.overlaps((13.0, 19.9), spans) and not noise.overlaps((1.0, 2.0), [])


def test_summary_says_when_the_noise_slows_the_kernel(noise):
    calm = [1.0 + 0.001 * (i % 7) for i in range(40)]
    slowed = [1.2 + 0.001 * (i % 5) for i in range(40)]
    s = noise.summary(calm, slowed)
    assert s["without_n"] == s["with_n"] == 40
    assert s["with_median_ms"] > s["without_median_ms"]
    lo, hi = s["without_over_with_ci"]
    assert lo <= hi < 1.0  # wholly below 1: slower with the noise
    same = noise.summary(calm, list(reversed(calm)))
    lo, hi = same["without_over_with_ci"]
    assert lo <= 1.0 <= hi
    assert noise.summary([], slowed) == {"without_n": 0, "with_n": 40}


def test_refuses_to_run_without_a_gpu(noise, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would run")
    assert noise.main(["--blocks", "1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
