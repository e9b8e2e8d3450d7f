"""scripts/device_policy_standin.py: both device policies run the stand-in load and report their figures."""

from __future__ import annotations

import json


def test_both_policies_run_the_stand_in_load(capsys):
    from scripts.device_policy_standin import main

    assert main(["--seconds", "2", "--population", "6", "--scale", "0.01"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"owner", "dispatcher"}
    for figures in out.values():
        assert figures["benchmarks_per_device_hour"] > 0 and 0 < figures["busy"] <= 1.0
        assert figures["timing"] <= figures["busy"] and figures["blocks_per_drain"] >= 1.0
