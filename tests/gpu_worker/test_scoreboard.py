"""`marathon bench` targets: a problem, or some of its shapes by number (one problem's rows on several GPUs).
Several candidates per problem (`--best` repeated): the fastest that passed is the row's best, and every one
measured stays in the row."""

import json
from pathlib import Path

import pytest

from baselines.registry import UnknownProblem
from gpu_worker.scoreboard import fastest_passing, main, make_row, parse_best, parse_target, run, write

ROOT = Path(__file__).resolve().parents[2]


def measured(key: str, ok: bool, time_ms: float | None, reason: str | None = None) -> dict:
    """The shape of what `measure` returns for one kernel on one shape (the fields a row reads)."""
    row = {"candidate_id": key[:16], "source_key": key, "ok": ok, "rel_err": 1e-3, "baseline_rel_err": 2e-3,
           "threshold": 1e-2}
    if time_ms is not None:
        row.update(time_ms=time_ms, baseline_ms=1.0, baseline_name="fla.chunk_kda", speedup=1.0 / time_ms,
                   speedup_ci=(0.9 / time_ms, 1.1 / time_ms), receipt={"device": "test"},
                   deciding_dist="strong", host_ms=time_ms + 0.2,
                   distributions=[{"dist": "mild", "time_ms": time_ms / 2, "baseline_ms": 1.0,
                                   "speedup": 2.0 / time_ms, "mode": "cuda-graph", "host_ms": time_ms,
                                   "baseline_host_ms": 1.1},
                                  {"dist": "strong", "time_ms": time_ms, "baseline_ms": 1.0,
                                   "speedup": 1.0 / time_ms, "mode": "cuda-graph", "host_ms": time_ms + 0.2,
                                   "baseline_host_ms": 1.2}])
    if reason:
        row["reason"] = reason
    return row


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
    from cli import build_parser

    seen = {}
    monkeypatch.setattr(sb, "run", lambda names, best, primary_only, out, settings: seen.update(
        names=names, best=best, primary_only=primary_only, out=str(out), spares=settings.spares) or [])
    monkeypatch.setenv("MARATHON_SPARES", "2")
    args = build_parser().parse_args(["bench", "kda@2,3", "mla_decode", "--best", "kda=abc", "--best", "kda=def",
                                      "--best", "mla_decode=123", "--primary-only", "--out", "/tmp/sb"])
    assert asyncio.run(args.fn(args)) == 0
    assert seen == {"names": ["kda@2,3", "mla_decode"], "best": {"kda": ["abc", "def"], "mla_decode": ["123"]},
                    "primary_only": True, "out": "/tmp/sb", "spares": 2}


def test_bench_refuses_a_bad_worker_setting_with_one_line(monkeypatch):
    import asyncio

    from cli import build_parser
    from cli.errors import UsageError

    monkeypatch.setenv("MARATHON_DEVICE_JOBS", "abc")
    args = build_parser().parse_args(["bench", "kda"])
    with pytest.raises(UsageError, match="^MARATHON_DEVICE_JOBS='abc': expected an integer >= 1$"):
        asyncio.run(args.fn(args))


def test_bench_refuses_a_shape_number_the_problem_lacks_before_anything_runs():
    with pytest.raises(SystemExit, match="0 B1 T8192 H32 D128"):
        main(["kda@0,9"])


def test_repeated_best_keeps_every_key_in_order_once():
    assert parse_best(["kda=k1", "mla_decode=m1", "kda=k2", "kda=k1"], ["kda", "mla_decode"]) == {
        "kda": ["k1", "k2"], "mla_decode": ["m1"]}
    assert parse_best([], ["kda"]) == {}


@pytest.mark.parametrize("arg, message", [
    ("kda", "expected PROBLEM=SOURCE_KEY"),
    ("kda=", "expected PROBLEM=SOURCE_KEY"),
    ("=abc", "expected PROBLEM=SOURCE_KEY"),
    ("no_such_problem=abc", "unknown problem 'no_such_problem'"),
    ("mla_decode=abc", "mla_decode is not among the problems measured"),
])
def test_bad_best_is_refused_with_one_message(arg, message):
    with pytest.raises(SystemExit, match=message):
        parse_best([arg], ["kda"])
    with pytest.raises(SystemExit, match=message):  # through the command, before anything is measured
        main(["kda@0", "--best", arg])


def test_bench_refuses_a_source_key_the_store_lacks_before_measuring(store, tmp_path):
    present = store.put_text("# a kernel")
    with pytest.raises(SystemExit, match=r"--best kda=0{64}: artifact 000000000000 not found"):
        run(["kda@0"], {"kda": [present, "0" * 64]}, True, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_fastest_passing_candidate_is_the_best():
    start = measured("s" * 64, True, 1.0)
    crowned, faster, failed_fastest = (measured("a" * 64, True, 0.8), measured("b" * 64, True, 0.6),
                                       measured("c" * 64, False, 0.1, "benchmark: output changed"))
    unverified = measured("d" * 64, False, None, "verify: rel_err 0.5 > 0.01")
    assert fastest_passing(start, [crowned, faster, failed_fastest, unverified]) is faster
    assert fastest_passing(start, [crowned]) is crowned
    assert fastest_passing(start, []) is start


def test_the_start_stays_best_unless_a_candidate_beats_it():
    start = measured("s" * 64, True, 1.0)
    assert fastest_passing(start, [measured("a" * 64, True, 1.2), measured("b" * 64, True, 1.0)]) is start
    assert fastest_passing(start, [measured("c" * 64, False, 0.5, "verify failed")]) is start
    rejected_start = measured("s" * 64, False, None, "compile: error")
    slow = measured("a" * 64, True, 3.0)
    assert fastest_passing(rejected_start, [slow, measured("b" * 64, True, 4.0)]) is slow
    assert fastest_passing(rejected_start, [measured("c" * 64, False, None, "x")]) is rejected_start


def test_of_equal_times_the_first_given_wins():
    start = measured("s" * 64, True, 1.0)
    crowned, same = measured("a" * 64, True, 0.5), measured("b" * 64, True, 0.5)
    assert fastest_passing(start, [crowned, same]) is crowned


def test_row_keeps_every_candidate_measured():
    start = measured("s" * 64, True, 1.0)
    found = [measured("a" * 64, True, 0.8), measured("b" * 64, True, 0.6),
             measured("c" * 64, False, None, "verify: rel_err 0.5 > 0.01")]
    row = make_row("kda", "B1 T8192 H32 D128", "fla.chunk_kda", start, found,
                   {"torch-chunked-fp32": {"mild": 6.0, "strong": 6.0}}, 0.1, 12.34)
    assert (row["best_ms"], row["best_candidate"], row["best_from"]) == (0.6, "b" * 16, "run")
    assert row["best_speedup"] == found[1]["speedup"] and row["receipt"] == found[1]["receipt"]
    # against another baseline too, the worst distribution decides
    assert row["speedups_vs_other_baselines"] == {"torch-chunked-fp32": 6.0 / 0.6}
    assert row["deciding_dist"] == "strong" and row["best_host_ms"] == 0.6 + 0.2
    assert [d["dist"] for d in row["start_distributions"]] == ["mild", "strong"]
    assert row["candidates"] == [
        {"source_key": "a" * 64, "candidate_id": "a" * 16, "ok": True, "time_ms": 0.8, "rel_err": 1e-3,
         "speedup": 1 / 0.8, "deciding_dist": "strong", "host_ms": 0.8 + 0.2, "reason": None},
        {"source_key": "b" * 64, "candidate_id": "b" * 16, "ok": True, "time_ms": 0.6, "rel_err": 1e-3,
         "speedup": 1 / 0.6, "deciding_dist": "strong", "host_ms": 0.6 + 0.2, "reason": None},
        {"source_key": "c" * 64, "candidate_id": "c" * 16, "ok": False, "time_ms": None, "rel_err": 1e-3,
         "speedup": None, "deciding_dist": None, "host_ms": None, "reason": "verify: rel_err 0.5 > 0.01"}]
    json.dumps(row)  # what scoreboard.json holds
    none_better = make_row("kda", "s", "fla.chunk_kda", start, [measured("a" * 64, True, 2.0)], {}, None, 1.0)
    assert none_better["best_from"] == "start" and none_better["best_ms"] == 1.0
    assert len(none_better["candidates"]) == 1
    assert make_row("kda", "s", "fla.chunk_kda", start, [], {}, None, 1.0)["candidates"] == []


def table(out_dir: Path) -> list[str]:
    return [line for line in (out_dir / "scoreboard.md").read_text().splitlines() if line.startswith("|")]


def test_the_committed_table_is_writes_rendering_and_old_rows_still_render(tmp_path):
    """docs/scoreboard.md's table is `write`'s rendering of docs/scoreboard.json (no number edited by hand);
    rows from before `candidates` existed render too, without the candidates note."""
    rows = json.loads((ROOT / "docs" / "scoreboard.json").read_text())
    write(rows, tmp_path)
    committed = [line for line in (ROOT / "docs" / "scoreboard.md").read_text().splitlines()
                 if line.startswith("|")]
    assert table(tmp_path) == committed[:len(rows) + 2]
    old = [{k: v for k, v in r.items() if k != "candidates"} for r in rows]
    write(old, tmp_path / "old")
    lines = table(tmp_path / "old")[2:]
    assert len(lines) == len(rows) and not any("candidates" in line for line in lines)


def test_the_best_cell_names_the_winner_only_among_several(tmp_path):
    old = json.loads((ROOT / "docs" / "scoreboard.json").read_text())[0]
    start = measured("s" * 64, True, 1.0)
    found = [measured("a" * 64, True, 0.8), measured("b" * 64, True, 0.6)]
    several = make_row("kda", "B1 T8192 H32 D128", "fla.chunk_kda", start, found, {}, None, 1.0)
    one = make_row("kda", "B1 T8192 H32 D128", "fla.chunk_kda", start, found[:1], {}, None, 1.0)
    slower = make_row("kda", "B1 T8192 H32 D128", "fla.chunk_kda", start,
                      [measured("a" * 64, True, 2.0), measured("b" * 64, False, None, "x")], {}, None, 1.0)
    write([old, several, one, slower], tmp_path)
    lines = table(tmp_path)[2:]
    assert f"| 0.6 (run {'b' * 16}, 2 candidates) |" in lines[1]
    assert "| 0.8 (run) |" in lines[2]
    assert "| 1 (start, 2 candidates) |" in lines[3]
    assert [c.count("|") for c in lines] == [14] * 4  # the table's columns stay as they were


def test_merge_keeps_the_later_row_of_a_shape_in_the_registrys_order(tmp_path):
    """Rows measured by separate runs become one scoreboard: a shape measured twice keeps the later file's
    row, rows come in the order of problems and shapes, and each row's time and clocks are listed."""
    from gpu_worker.scoreboard import merge

    start = measured("s" * 64, True, 1.0)

    def row(problem, shape, ms):
        r = make_row(problem, shape, "b", {**start, "time_ms": ms}, [], {}, None, 1.0)
        r["receipt"] = {"device": "NVIDIA H200", "driver": "1", "torch": "2", "triton": "3", "clocks": f"sm {ms}"}
        return r

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([row("mla_decode", "B1 H64 S8192 Q4", 4.0), row("kda", "B1 T32768 H32 D128", 1.0)]))
    b.write_text(json.dumps([row("kda", "B1 T32768 H32 D128", 2.0), row("kda", "B1 T8192 H32 D128", 3.0),
                             row("mla_decode", "B1 H64 S8192 Q1", 5.0)]))
    rows = merge([str(a), str(b)])
    assert [(r["problem"], r["shape"], r["best_ms"]) for r in rows] == [
        ("kda", "B1 T8192 H32 D128", 3.0), ("kda", "B1 T32768 H32 D128", 2.0),
        ("mla_decode", "B1 H64 S8192 Q1", 5.0), ("mla_decode", "B1 H64 S8192 Q4", 4.0)]
    assert main(["--merge", str(a), str(b), "--out", str(tmp_path / "sb")]) == 0
    md = (tmp_path / "sb" / "scoreboard.md").read_text()
    assert json.loads((tmp_path / "sb" / "scoreboard.json").read_text()) == rows
    assert "on NVIDIA H200 (driver 1, torch 2, triton 3)" in md
    assert f"- kda B1 T32768 H32 D128: {rows[1]['measured_at']}, clocks sm 2.0" in md
    assert len(table(tmp_path / "sb")) == 2 + 4


@pytest.mark.parametrize("content, message", [(None, "No such file"), ("{not json", "Expecting"),
                                              ('[{"problem": "kda"}]', "not a scoreboard.json")])
def test_merge_refuses_a_file_that_is_no_scoreboard_with_one_message(tmp_path, content, message):
    f = tmp_path / "x.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(SystemExit, match=message):
        main(["--merge", str(f), "--out", str(tmp_path / "sb")])
    assert not (tmp_path / "sb").exists()  # nothing written


def test_merge_measures_nothing_so_it_takes_no_targets(tmp_path):
    with pytest.raises(SystemExit, match="measures nothing"):
        main(["kda", "--merge", str(tmp_path / "x.json")])


def test_marathon_bench_merge_refuses_a_missing_file_with_one_line(tmp_path):
    import asyncio

    from cli import UsageError, build_parser

    args = build_parser().parse_args(["bench", "--merge", str(tmp_path / "nope.json"), "--out", str(tmp_path)])
    with pytest.raises(UsageError, match=r"^--merge .*nope.json: \[Errno 2\]"):
        asyncio.run(args.fn(args))


@pytest.mark.slow(30)
def test_measure_keeps_where_the_time_of_verify_and_benchmark_went(store):
    """The starting softmax kernel through the real harness (the Triton interpreter, CPU shape): the row's
    phases name the steps of its verification and its benchmark, each in seconds."""
    from baselines.registry import get_problem
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.scoreboard import measure

    p = get_problem("softmax")
    ev = Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=1))
    try:
        row = measure(ev, store, p, p.cpu_shape, p.render(p.default_knobs()))
    finally:
        ev.close()
    assert row["ok"], row
    for step in ("verify", "benchmark"):
        ph = row["phases"][step]
        assert ph and all(isinstance(v, float) and v >= 0 for v in ph.values()), (step, ph)
    assert any(k.startswith("ref.") for k in row["phases"]["verify"]), row["phases"]["verify"]
    json.dumps(row)
