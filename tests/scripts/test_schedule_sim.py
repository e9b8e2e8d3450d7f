"""scripts/schedule_sim.py: the policies and knobs compared on the simulated schedule, one table; a phase
log's costs; bad input refused with one line."""

from __future__ import annotations

import json

import pytest


def test_both_policies_and_a_swept_knob_in_one_table(capsys):
    from scripts.schedule_sim import main

    assert main(["--hours", "0.1", "--seeds", "1", "--jobs", "4", "8", "--batch", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["jobs"]) for r in rows] == [("owner", 4), ("owner", 8), ("dispatcher", 4),
                                                        ("dispatcher", 8)]
    for r in rows:
        assert r["evals_per_h"] > 0 and 0 < r["timing"] <= r["busy"] <= 1.0 and r["bad"] == 0
    assert main(["--hours", "0.05", "--seeds", "1", "--policy", "owner", "--beside", "0", "8", "--engine",
                 "recorded"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert [line.split()[6] for line in text[1:3]] == ["0", "8"]  # the beside column, swept
    assert text[0].split()[:3] == ["policy", "cand", "jobs"] and text[1].split()[0] == "owner"


def test_costs_from_a_phase_log(tmp_path, capsys):
    from scripts.schedule_sim import main

    log = tmp_path / "gpu0.log"
    lines = [{"event": "compile", "seconds": 10.0, "timestamp": "2026-01-01T00:00:10Z",
              "phases": {"gpu-job-held": 0.3, "gpu-jobs": 1}},
             {"event": "verify", "seconds": 8.0, "timestamp": "2026-01-01T00:00:20Z",
              "phases": {"gpu-job-held": 2.0, "gpu-job-wait": 3.0}},
             {"event": "benchmark", "seconds": 9.0, "timestamp": "2026-01-01T00:00:30Z",
              "phases": {"gpu-job-held": 1.3, "gpu-held": 1.0, "gpu-blocks": 1}}]
    log.write_text("not json\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    assert main(["--log", str(log), "--hours", "0.05", "--seeds", "1", "--candidates", "4", "--json"]) == 0
    assert all(r["evals_per_h"] > 0 for r in json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("argv", [["--log", "/nonexistent/gpu0.log"], ["--hours", "0"], ["--jobs", "0"],
                                  ["--policy", "fifo"], ["--beside", "-1"], ["--retry-burst", "0"],
                                  ["--engine", "then"], ["--block-scale", "0"], ["--job-scale", "-1"]])
def test_bad_input_is_refused_with_exit_2(argv, capsys):
    from scripts.schedule_sim import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_log_without_every_stage_is_refused(tmp_path, capsys):
    from scripts.schedule_sim import main

    log = tmp_path / "gpu0.log"
    log.write_text(json.dumps({"event": "compile", "seconds": 1.0, "timestamp": "2026-01-01T00:00:10Z"}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["--log", str(log)])
    assert e.value.code == 2 and "no costs for the stages verify, benchmark" in capsys.readouterr().err
