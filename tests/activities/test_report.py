"""The report's progress picture (activities/report.py): what it draws from a run's records."""

from activities.report import CROWN_NOTE, _plots, progress_figure, progress_series
from workflows.contracts import IterationRecord


def _rec(i, outcome, speedup=None, finished=0.0, **kw):
    return IterationRecord(iteration=i, candidate_id=f"c{i}", source_key="k", outcome=outcome, speedup=speedup,
                           time_ms=1.0 / speedup if speedup else None, started_at=100.0, finished_at=finished, **kw)


def test_the_wall_time_curve_follows_the_order_records_finished_in():
    # iteration 3 finished before iteration 2 (evaluations run in parallel): the curve must not run back in time
    records = [_rec(1, "improved", 1.0, 160.0), _rec(2, "improved", 1.2, 400.0), _rec(3, "passed", 0.8, 220.0),
               _rec(4, "rejected", finished=280.0, stage="verify")]
    s = progress_series(records)
    assert s["minutes"] == sorted(s["minutes"]) == [1.0, 2.0, 3.0, 5.0]
    assert s["best_by_time"] == [1.0, 1.0, 1.0, 1.2]
    assert s["iter"] == [1, 2, 3, 4] and s["best"] == [1.0, 1.2, 1.2, 1.2]
    # every measured candidate is drawn, the rejected one is not
    assert s["cand_iter"] == [1, 2, 3] and s["cand"] == [1.0, 1.2, 0.8]


def test_the_wall_time_curve_keeps_the_best_when_an_older_improvement_finishes_later():
    # population 2: iteration 3 beat iteration 2 and finished first; iteration 2's record, finishing last, is an
    # improvement on iteration 1 only, never the best after iteration 3
    records = [_rec(1, "improved", 1.0, 160.0), _rec(2, "improved", 1.2, 400.0), _rec(3, "improved", 1.5, 220.0)]
    s = progress_series(records)
    assert s["minutes"] == [1.0, 2.0, 5.0]
    assert s["best_by_time"] == [1.0, 1.5, 1.5]
    assert s["best"] == [1.0, 1.2, 1.5]


def test_under_the_interpreter_it_draws_times_not_ratios(tmp_path):
    records = [_rec(1, "improved", 0.02, 130.0, interpreter=True), _rec(2, "passed", 0.01, 190.0, interpreter=True)]
    s = progress_series(records)
    assert s["cand"] == [50.0, 100.0] and s["best"] == [50.0, 50.0]
    assert _plots(records, tmp_path) == ["progress.png"] and (tmp_path / "progress.png").stat().st_size > 0


def test_the_picture_says_that_crowning_takes_a_confident_win():
    """A verified candidate faster than the crowned best (one timing) is no bug: legend and note say why."""
    import matplotlib.pyplot as plt

    records = [_rec(1, "improved", 1.05, 130.0), _rec(2, "passed", 1.10, 190.0)]  # 2 looks faster, not crowned
    s = progress_series(records)
    assert max(s["cand"]) > s["best"][-1]
    fig = progress_figure(records)
    try:
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        notes = [t.get_text() for t in fig.texts]
    finally:
        plt.close(fig)
    assert labels == ["each verified candidate (one timing)", "crowned best (a confident win)"]
    assert CROWN_NOTE in notes and "95% confidence in one head-to-head timing" in CROWN_NOTE


def test_long_reasons_and_rationales_are_cut_between_words():
    from types import SimpleNamespace

    from activities.report import render_markdown
    from workflows.contracts import Used
    from workflows.text import clip

    assert clip("compile: out of shared memory: required 262144 bytes\nsecond line", 30) == "compile: out of shared..."
    assert clip("short", 30) == "short" and clip(None, 10) == "" and clip("x" * 40, 10) == "xxxxxxx..."
    reason = "verify: max relative error 3.1e-02 exceeds the tolerance 1.0e-03 on distribution wide at seed 2"
    records = [_rec(1, "rejected", finished=130.0, stage="verify", reason=reason),
               _rec(2, "passed", 1.1, 190.0, rationale="mutate c1 (1.1x): BLOCK_N 512->1024, num_warps 4->8, "
                                                        "ROWS 2->4 and more words after")]
    st = SimpleNamespace(problem="softmax", best=None, used=Used(), runs=1, stopped_by="budget-iterations")
    md = render_markdown("r1", st, records, [], None)
    table = md.split("## Iterations", 1)[1]
    assert "| verify: verify: max relative error 3.1e-02 exceeds the tolerance..." in table
    assert "mutate c1 (1.1x): BLOCK_N 512->1024, num_warps 4->8,..." not in table  # trailing comma dropped
    assert "mutate c1 (1.1x): BLOCK_N 512->1024, num_warps 4->8..." in table
