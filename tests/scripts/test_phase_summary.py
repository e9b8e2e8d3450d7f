"""scripts/phase_summary.py: the figures docs/results.md quotes are recomputed from a phase log."""

import gzip
import json

import pytest


@pytest.fixture()
def ps(load_script):
    return load_script("phase_summary")


def _line(run, event, end_s, seconds, phases):
    ts = f"2026-11-30T16:00:{end_s:06.3f}Z"
    return json.dumps({"workflow_id": run, "event": event, "seconds": seconds, "phases": phases, "timestamp": ts})


@pytest.fixture()
def log(tmp_path):
    lines = [
        "worker (gpu) polling marathon-gpu-0",  # plain text lines are skipped
        _line("old-run", "benchmark", 5.0, 5.0, {"gpu-wait": 1.0}),  # starts at 0: the log's first activity
        _line("new-run", "verify", 12.0, 4.0, {"gpu-job-wait": 3.0}),
        _line("new-run", "benchmark", 20.0, 6.0, {"gpu-wait": 2.0}),
        _line("new-run", "benchmark", 30.0, 4.0, {"gpu-wait": 4.0}),
        _line("new-run", "benchmark", 40.0, 5.0, {"gpu-wait": 6.0}),
    ]
    p = tmp_path / "gpu0.log.gz"
    with gzip.open(p, "wt") as f:
        f.write("\n".join(lines) + "\n")
    return str(p)


def test_run_and_after_filter_the_activities(ps, log):
    assert len(ps.activities(log)) == 5
    assert {d["workflow_id"] for d in ps.activities(log, run="new")} == {"new-run"}
    # started at least 15 s after the log's first activity started (0 s): the last two benchmarks
    late = ps.activities(log, run="new", after=15)
    assert sorted(d["phases"]["gpu-wait"] for d in late) == [4.0, 6.0]
    text = ps.summarize(late)
    assert "benchmark: 2 activities, mean 4.50 s" in text and "gpu-wait" in text and "verify" not in text


def test_rate_first_to_last_benchmark_with_smi(ps, log):
    rows = ps.activities(log, run="new")
    t = {d["event"] + str(d["seconds"]): ps._end(d) for d in rows}
    first = t["benchmark6.0"]
    smi = [(first + 1, 0, 40.0, 2048.0, 1980.0), (first + 2, 0, 20.0, 4096.0, 1980.0),
           (first + 2, 1, 99.0, 9999.0, 1980.0),  # another GPU: not counted
           (first + 100, 0, 100.0, 8192.0, 1980.0)]  # after the last benchmark: not counted
    out = ps.rate(rows, smi, gpu=0)
    # 3 benchmarks over 20 s: 2 intervals -> 360/h
    assert out.startswith("3 benchmarks, 360/h over 20 s")
    assert "utilization 30.0%" in out and "peak memory 4 GiB" in out
    cpu = [(first + 1, 0.5, 8.0), (first + 2, 0.7, 10.0), (first + 100, 1.0, 16.0)]  # the last: outside
    samples = [{"t": first, "closed": {"gpu0": 3.0}}, {"t": first + 10, "closed": {"gpu0": 7.0}},
               {"t": first + 20, "closed": {"gpu0": 9.0, "gpu1": 0.0}}, {"t": first + 50, "closed": {"gpu0": 50.0}}]
    out = ps.rate(rows, smi, gpu=0, cpu=cpu, samples=samples)
    assert "host CPU busy 60% (load average 9.0)" in out
    assert "new jobs waited for timing 30% of the time" in out  # (9 - 3) s over 20 s
    assert ps.rate(rows[:1]) == "0 benchmarks: no rate"


def test_per_minute_counts_whole_minutes_from_the_first_benchmark(ps, tmp_path):
    # benchmarks end at 0, 10, 59.9 (minute 0), 60, 61 (minute 1), none in minute 2, 185 (minute 3, partial:
    # the span is 185 s, three whole minutes, so the last one is left out)
    from datetime import datetime, timedelta, timezone

    def line(event, end_s):
        ts = (datetime(2026, 11, 30, 16, tzinfo=timezone.utc) + timedelta(seconds=end_s)).isoformat()
        return json.dumps({"workflow_id": "r", "event": event, "seconds": 0.5, "phases": {},
                           "timestamp": ts.replace("+00:00", "Z")})

    lines = [line("benchmark", e) for e in (0.5, 10.5, 60.4, 60.5, 61.5, 185.5)]
    lines.append(line("verify", 30.5))  # not a benchmark
    p = tmp_path / "g.log"
    p.write_text("\n".join(lines) + "\n")
    out = ps.per_minute(ps.activities(str(p)))
    assert out == "benchmarks per minute from the first: [3, 2, 0]; per hour: [180, 120, 0]"
    assert ps.per_minute([]) == "no benchmarks"


def test_command_line(ps, log, tmp_path, capsys):
    session = tmp_path / "session.json"
    session.write_text(json.dumps({"smi": []}))
    assert ps.main(["--rate", "--run", "new", "--smi", str(session), log]) == 0
    out = capsys.readouterr().out
    assert "3 benchmarks, 360/h" in out and "old-run" not in out


def test_concurrency_with_compactions_on_the_same_clock(ps, log, tmp_path, capsys):
    # the log's first activity starts at 16:00:00; compactions of new-run finish at 16:00:25 and 16:00:38,
    # one of another run (not asked for) at 16:00:30
    agent = tmp_path / "agent.log"
    agent.write_text("\n".join([
        "agent worker started",
        json.dumps({"workflow_id": "new-run", "event": "compacted", "timestamp": "2026-11-30T16:00:25.000Z"}),
        json.dumps({"workflow_id": "other", "event": "compacted", "timestamp": "2026-11-30T16:00:30.000Z"}),
        json.dumps({"workflow_id": "new-run", "event": "proposed", "timestamp": "2026-11-30T16:00:31.000Z"}),
        json.dumps({"workflow_id": "new-run", "event": "compacted", "timestamp": "2026-11-30T16:00:38.000Z"}),
    ]) + "\n")
    rows = ps.activities(log)
    out = ps.concurrency(rows, step=10, window=20, compacted=ps.compactions(str(agent), "new"))
    # activities span 0-5 (old), 8-12, 14-20, 26-30, 35-40; sampled at 0, 10, 20, 30
    assert "running activities every 10 s: [1, 1, 0, 0]" in out
    assert "benchmarks finished per 20 s: [1, 2]" in out
    assert out.endswith("compactions finished at (s): [25, 38]")
    assert "compactions" not in ps.concurrency(rows)
    assert ps.main(["--concurrency", "--run", "new", "--agent", str(agent), log]) == 0
    assert "compactions finished at (s): [17, 30]" in capsys.readouterr().out  # t0: new-run's first start, 8 s


def _written(tmp_path, lines: list[str]) -> str:
    """A plain phase log of `lines`; its path."""
    p = tmp_path / "g.log"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_timing_blocks_per_drain(ps, tmp_path, capsys):
    # three activities' timing blocks: 5 in all, 2 of which drained the device (opened a window)
    lines = [_line("r", "benchmark", 10.0, 2.0, {"gpu-wait": 1.0, "gpu-blocks": 1, "gpu-drains": 1}),
             _line("r", "benchmark", 11.0, 2.0, {"gpu-wait": 1.5, "gpu-blocks": 1}),
             _line("r", "profile", 12.0, 3.0, {"gpu-blocks": 3, "gpu-drains": 1}),
             _line("r", "verify", 13.0, 1.0, {"gpu-job-wait": 0.5})]
    p = _written(tmp_path, lines)
    rows = ps.activities(p)
    assert ps.drains(rows) == "timing blocks: 5 after 2 drains, 2.50 per drain"
    assert ps.drains(rows[3:]) == ""  # no timing block: nothing to say
    assert ps.drains(rows[1:2]) == "timing blocks: 1, their drains in activities left out"
    assert ps.main([p]) == 0
    assert "timing blocks: 5 after 2 drains, 2.50 per drain" in capsys.readouterr().out


def test_verifications_given_the_compiles_child(ps, tmp_path, capsys):
    # two of three verifications took the compile's child; the third loaded afresh and compiled for 9 s
    lines = [_line("r", "verify", 10.0, 2.0, {"handed-on": 1}),
             _line("r", "verify", 11.0, 2.0, {"handed-on": 1, "compile": 0.0}),
             _line("r", "verify", 12.0, 11.0, {"load": 0.4, "compile": 9.0}),
             _line("r", "benchmark", 13.0, 1.0, {"handed-on": 2})]
    p = _written(tmp_path, lines)
    rows = ps.activities(p)
    assert ps.handed_on(rows) == "verifications given the compile's child: 2 of 3, compiling again 9.00 s each"
    assert ps.handed_on(rows[:2]) == "verifications given the compile's child: 2 of 2"
    assert ps.handed_on(rows[3:]) == ""
    assert ps.main([p]) == 0
    assert "2 of 3" in capsys.readouterr().out


def test_renders_given_their_kernels(ps, tmp_path, capsys):
    # a render's compile with nothing kept yet, its verification's fresh child given two entries, and a
    # benchmark of a source that is no render (no render-seed-n phase: left out)
    lines = [_line("r", "compile", 10.0, 12.0, {"render-seed-n": 0, "compile": 9.0}),
             _line("r", "verify", 11.0, 4.0, {"render-seed-n": 2, "compile": 1.5}),
             _line("r", "benchmark", 12.0, 9.0, {"compile": 8.0})]
    p = _written(tmp_path, lines)
    rows = ps.activities(p)
    assert ps.render_seeds(rows) == ("renders given their kernels: compile 0 of 1 (compiling not 9.00 s); "
                                     "verify 1 of 1 (compiling given 1.50 s)")
    assert ps.render_seeds(rows[2:]) == ""
    assert ps.main([p]) == 0
    assert "verify 1 of 1" in capsys.readouterr().out
