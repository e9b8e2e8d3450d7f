"""The wording of budgets left and of an evaluation's summary (the Web UI's Timeline labels with it)."""

from __future__ import annotations

from workflows.contracts import BestRef, Budget, CarriedState, Used
from workflows.text import budget_text, evaluation_summary, left_text


def test_left_text_names_each_limited_budget_and_never_goes_below_zero():
    used = Used(iterations=12, seconds=1800, tokens_in=700, tokens_out=300, gpu_seconds=50)
    assert left_text(Budget(iterations=30, hours=2, tokens=5000, gpu_seconds=600), used) == \
        "18 iterations, 1.50 h, 4,000 tokens, 550.0 GPU-s"
    assert left_text(Budget(iterations=10), used) == "0 iterations"
    assert left_text(Budget(iterations=13), used) == "1 iteration"
    assert budget_text(Budget(iterations=1)) == "1 iteration" and budget_text(Budget(iterations=2)) == "2 iterations"
    assert left_text(Budget(iterations=None), used) == "no limit"


def _best(interpreter: bool) -> BestRef:
    return BestRef(candidate_id="c0ffee", source_key="k", speedup=1.1234, time_ms=0.8741, baseline_ms=0.982,
                   iteration=3, interpreter=interpreter)


def test_an_evaluation_s_summary_carries_the_best_so_far_and_the_budget_left():
    st = CarriedState(iteration=6, used=Used(iterations=6))
    assert evaluation_summary(7, "abc", Budget(iterations=30), st) == "#7 abc | best none yet | left 24 iterations"
    st.best = _best(interpreter=False)
    assert evaluation_summary(7, "abc", Budget(iterations=30), st) == \
        "#7 abc | best 1.12x, 0.8741 ms (#3) | left 24 iterations"
    st.best = _best(interpreter=True)  # interpreter times: never a ratio
    assert evaluation_summary(7, "abc", Budget(iterations=30), st) == \
        "#7 abc | best 0.8741 ms (#3, interpreter) | left 24 iterations"
