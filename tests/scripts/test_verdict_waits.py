"""session_results.verdict_waits: each verdict's wait from submission to record, where the run records in
iteration order (an iteration is recorded once it and every one before it have ended)."""

from workflows.contracts import IterationRecord


def rec(iteration: int, outcome: str, started: float, finished: float) -> IterationRecord:
    return IterationRecord(iteration=iteration, candidate_id=f"c{iteration}", source_key="k" * 64, outcome=outcome,
                           started_at=started, finished_at=finished)


def test_a_verdict_waits_for_the_iterations_before_it(load_script):
    waits = load_script("session_results").verdict_waits([
        rec(2, "passed", 100.0, 103.0),  # ended early, held until 1 ended at 130: waited 30 s, 27 s of it held
        rec(1, "improved", 100.0, 130.0),  # a new best: 30 s, none held
        rec(3, "rejected", 110.0, 140.0),  # its own end: 30 s, none held
        rec(4, "passed", 139.0, 141.0),  # 2 s
        rec(5, "passed", 0.0, 0.0),  # no times (an old record): not counted
    ])
    assert waits["best"] == {"n": 1, "median_s": 30.0, "p90_s": 30.0, "max_s": 30.0, "held_median_s": 0.0}
    assert waits["loser"] == {"n": 3, "median_s": 30.0, "p90_s": 30.0, "max_s": 30.0, "held_median_s": 0.0}
    only_losers = load_script("session_results").verdict_waits([rec(1, "passed", 0.5, 2.5), rec(2, "passed", 1.0, 2.0)])
    assert "best" not in only_losers and only_losers["loser"]["held_median_s"] == 0.25


def test_a_candidacy_counts_as_held_from_its_own_answer(load_script):
    """A would-be best of the first population (no best yet) ends only once the run answers its candidacy,
    in order: its record's finished_at is then, and the time held is counted from its own stages' answer."""
    def judged(iteration, started, judged_at, finished):
        return rec(iteration, "passed", started, finished).model_copy(update={"judged_at": judged_at})

    waits = load_script("session_results").verdict_waits([
        rec(1, "improved", 1.0, 200.0),  # the first best: its checks until 200 s
        judged(2, 1.0, 40.0, 201.0),  # answered at 40 s, not crowned once 1 was: held 161 s
        judged(3, 1.0, 60.0, 201.5),  # held 141.5 s
    ])
    assert waits["loser"]["median_s"] == 200.25 and waits["loser"]["held_median_s"] == 151.25
