"""Rejections name their cheating family: the reports carry it, and the run's report counts it."""

from workflows.contracts import (FAMILIES, BenchReport, Budget, CompileReport, IterationRecord, RuleReport,
                                 Status, Used, VerifyReport, family_of)


def test_family_is_read_from_the_reason_of_a_rejection():
    assert set(FAMILIES) == {"network", "process", "filesystem", "output-cache", "lazy-output", "precomputed",
                             "shape-specific", "stream", "timer"}
    assert VerifyReport(ok=False, stage="rules", reason="network: socket refused (run-time guard)").family == "network"
    assert BenchReport(ok=False, reason="timer: time.perf_counter was replaced").family == "timer"
    assert CompileReport(ok=False, error="process: subprocess.Popen refused").family == "process"
    assert RuleReport(ok=False, rule="lazy-output", detail="line 3: ...").family == "lazy-output"
    # not a family: wrong answers, library kernels, escapes; and nothing on a pass
    assert VerifyReport(ok=False, reason="wrong: rel err 0.3").family is None
    assert RuleReport(ok=False, rule="escape", detail="x").family is None
    assert VerifyReport(ok=True, reason="network: is only text here").family is None
    assert family_of("stream:x") == "stream" and family_of("") is None and family_of(None) is None


def test_records_written_before_the_field_existed_still_load_and_get_it():
    old = {"iteration": 3, "candidate_id": "c", "source_key": "k", "outcome": "rejected", "stage": "rules",
           "reason": "filesystem: write to '/etc/x' outside the sandbox's temp directory (run-time guard)"}
    rec = IterationRecord.model_validate(old)
    assert rec.family == "filesystem"
    assert IterationRecord.model_validate_json(rec.model_dump_json()) == rec


def test_the_run_report_counts_families():
    from activities.report import render_markdown

    def rec(i, reason, outcome="rejected"):
        return IterationRecord(iteration=i, candidate_id=f"c{i}", source_key="k", outcome=outcome,
                               stage="rules" if outcome == "rejected" else None, reason=reason)

    records = [rec(1, "network: socket refused"), rec(2, "network: socket.connect refused"),
               rec(3, "lazy-output: torch modes left active"), rec(4, "wrong: rel err 1"), rec(5, "", "passed")]
    st = Status(workflow_id="w", problem="softmax", policy="search", iteration=5, phase="done", best=None,
                budget=Budget(iterations=5), used=Used(), runs=1, paused=False)
    md = render_markdown("w", st, records, [], None)
    section = md.split("## Rejections by cheating family")[1].split("##")[0]
    assert "| network | 2 |" in section and "| lazy-output | 1 |" in section
    assert "wrong" not in section
