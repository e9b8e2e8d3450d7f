"""scripts/gate_sim.py drives the real TimedLock with a synthetic load and reports what docs/throughput.md quotes."""

import pytest


@pytest.fixture()
def sim(load_script):
    return load_script("gate_sim")


def test_simulation_counts_evaluations_and_waits(sim):
    r = sim.simulate(patience_s=1.0, minutes=2.0, population=4, scale=0.01, overhead=0.5)
    assert r["patience_s"] == 1.0
    # 4 candidates, each evaluation about 20 simulated seconds of holds and host work: some hundreds per hour
    assert 100 < r["evaluations_per_hour"] < 4 * 3600 / 15
    assert 0 < r["timed_fraction"] < 1
    assert r["shared_wait_mean_s"] >= 0 and r["timing_wait_mean_s"] >= 0


def test_bad_arguments_refused(sim, capsys):
    with pytest.raises(SystemExit) as e:
        sim.main(["--scale", "0"])
    assert e.value.code == 2 and "--scale in (0, 1]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        sim.main(["--timing", "0"])
    assert e.value.code == 2 and "--timing > 0" in capsys.readouterr().err


def test_shorter_timings_hold_the_exclusive_side_less(sim):
    full = sim.simulate(patience_s=1.0, minutes=2.0, population=4, scale=0.01, overhead=0.5)
    short = sim.simulate(patience_s=1.0, minutes=2.0, population=4, scale=0.01, overhead=0.5, timing_s=0.1)
    assert short["timed_fraction"] < full["timed_fraction"]
