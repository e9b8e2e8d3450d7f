"""What a run shows of itself, from its state: no interpreter ratio shown as a speedup anywhere, the stop's
reason carried to the result."""

from __future__ import annotations

from workflows import run_view
from workflows.contracts import BestRef, CarriedState, IterationRecord, RunSpec, StopRequest


def _state(interpreter: bool) -> CarriedState:
    st = CarriedState(iteration=7)
    st.best = BestRef(candidate_id="c7", source_key="k", speedup=1.4, time_ms=0.5, baseline_ms=0.7, iteration=7,
                      interpreter=interpreter)
    st.last = IterationRecord(iteration=7, candidate_id="c7", source_key="k", outcome="improved", speedup=1.4,
                              interpreter=interpreter)
    return st


def test_an_interpreter_ratio_is_no_speedup_in_the_status_or_the_web_ui():
    spec = RunSpec(problem="softmax")
    for interpreter in (True, False):
        st = _state(interpreter)
        s = run_view.status("wf", spec, st, "proposing", None)
        assert (s.best.speedup, s.last.speedup) == ((None, None) if interpreter else (1.4, 1.4))
        assert s.best.time_ms == 0.5 and s.iteration == 7 and not s.stopping
        names = {a.key.name for a in run_view.search_attributes(spec, st, "proposing")}
        assert ("MarathonBestSpeedup" in names) is not interpreter
        assert {"MarathonProblem", "MarathonIteration", "MarathonPhase"} <= names
    assert st.last.speedup == 1.4  # the run's own record keeps its figure


def test_the_result_carries_the_operators_reason_only_for_a_stop():
    spec, st = RunSpec(problem="softmax"), _state(False)
    stopped = run_view.result("wf", spec, st, "stop-signal", StopRequest(reason="enough"), True)
    assert (stopped.stop_reason, stopped.reverified, stopped.best.speedup) == ("enough", True, 1.4)
    spent = run_view.result("wf", spec, st, "budget-iterations", StopRequest(reason="enough"), None)
    assert spent.stop_reason is None and spent.stopped_by == "budget-iterations" and spent.iterations == 7
