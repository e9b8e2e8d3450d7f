"""gpu_session.py's --bench: which of a run's kernels the scoreboard measures (the crowned best and the
fastest passing candidates from the run's ledger, session_results.py), and that `marathon bench` takes them as given."""

import pytest

from activities.ledger import append_chunk
from gpu_worker.scoreboard import parse_best
from workflows.contracts import IterationRecord


@pytest.fixture()
def session(load_script):
    return load_script("gpu_session")


@pytest.fixture()
def results(load_script):
    return load_script("session_results")


def record(iteration: int, key: str, outcome: str, time_ms: float | None, stage: str | None = None
           ) -> IterationRecord:
    return IterationRecord(iteration=iteration, candidate_id=key[:16], source_key=key, outcome=outcome,
                           stage=stage, time_ms=time_ms, speedup=1.0 / time_ms if time_ms else None)


def key(c: str) -> str:
    return c * 64


# the crowned best (a, iteration 1) is the slowest passing kernel: it was crowned first and the others never
# beat it with 95% confidence; e failed its benchmark with a fast time; f was rejected before timing
RECORDS = [record(0, key("f"), "rejected", None, "verify"), record(1, key("a"), "improved", 1.0),
           record(2, key("b"), "passed", 0.7), record(3, key("e"), "rejected", 0.1, "benchmark"),
           record(4, key("c"), "passed", 0.9), record(5, key("d"), "passed", 0.8),
           record(6, key("b"), "passed", 0.75)]


def test_fastest_passing_candidates_by_in_run_time_each_once(results):
    assert results.fastest_passing_source_keys(RECORDS) == [key("b"), key("d"), key("c")]
    assert results.fastest_passing_source_keys(RECORDS, 1) == [key("b")]
    assert results.fastest_passing_source_keys([r for r in RECORDS if r.outcome == "rejected"]) == []


def test_bench_measures_the_crowned_best_and_the_fastest_from_the_ledger(results, store):
    head = append_chunk(store, None, "h200-kda-1", 0, RECORDS[:3])
    head = append_chunk(store, head, "h200-kda-1", 1, RECORDS[3:])  # continued-as-new: a second chunk
    st = {"best": {"candidate_id": key("a")[:16], "speedup": 1.0}, "ledger_key": head}
    assert results.bench_source_keys(st, results.run_records(st)) == [key("a"), key("b"), key("d"), key("c")]
    crowned_fastest = {"best": {"candidate_id": key("b")[:16], "speedup": 1.4}, "ledger_key": head}
    assert results.bench_source_keys(crowned_fastest, results.run_records(crowned_fastest)) == [key("b"), key("d"), key("c")]
    assert results.bench_source_keys({"best": None}, results.run_records({"ledger_key": head})) == [key("b"), key("d"), key("c")]
    assert results.bench_source_keys({"best": None}, results.run_records({"ledger_key": None})) == []


def test_bench_arguments_reach_the_scoreboard_whole(session):
    runs = {"kda": {"bench_source_keys": [key("a"), key("b")]}, "mla_decode": {"bench_source_keys": [key("c")]},
            "mla_prefill": {"bench_source_keys": []}}
    args = session.best_args(["kda@0,1", "kda@2", "mla_prefill"], runs)
    assert args == ["--best", f"kda={key('a')}", "--best", f"kda={key('b')}"]
    assert parse_best(args[1::2], ["kda", "mla_prefill"]) == {"kda": [key("a"), key("b")]}
    assert session.best_args(["mla_decode"], runs) == ["--best", f"mla_decode={key('c')}"]
    assert session.best_args(["softmax"], runs) == []
