"""The llm policy's notebook rewrite against the scripted server: what the deterministic notebook keeps
whatever the summarising model writes."""

from __future__ import annotations

from activities.llm.compaction import rewrite_notebook
from activities.notebook import summarize
from tests.llm.server import ChatServer, completion
from workflows.contracts import CompactRequest, IterationRecord


def test_the_notebook_keeps_failures_and_hints_when_the_summariser_drops_them(store, llm_env):
    recs = [IterationRecord(iteration=1, candidate_id="a" * 16, source_key="k", outcome="rejected", stage="compile",
                            reason="triton.CompilationError: BLOCK_N must be a power of 2", rationale="BLOCK_N=1000"),
            IterationRecord(iteration=2, candidate_id="b" * 16, source_key="k", outcome="rejected", stage="verify",
                            reason="rel err 3.1 on the wide inputs: exp overflow", rationale="no max subtraction"),
            IterationRecord(iteration=3, candidate_id="c" * 16, source_key="k", outcome="passed", speedup=1.2,
                            time_ms=1.0, baseline_ms=1.2, rationale="two rows per program")]
    req = CompactRequest(workflow_id="w", problem="softmax", policy="llm", run=1, records=recs,
                         hints=["HINT-7: keep BLOCK_N a power of two"])
    deterministic = summarize("softmax", 1, None, recs, recs, None)
    with ChatServer(lambda body, headers: completion("## What works\nTwo rows per program: 1.2x.\n## Next\nmore rows",
                                                     prompt_tokens=400, completion_tokens=30)) as server:
        llm_env(server)
        text, tin, tout = rewrite_notebook(req, deterministic, store)
    assert (tin, tout) == (400, 30)
    assert "Two rows per program: 1.2x." in text  # the model's notebook
    assert "## What failed and why" in text and "compile: triton.CompilationError: BLOCK_N must be a power of 2" in text
    assert "verify: rel err 3.1 on the wide inputs" in text
    assert "## Operator hints in force\n- HINT-7: keep BLOCK_N a power of two" in text
    assert text.startswith("# Notebook: softmax, version 1")


def test_the_notebook_shows_interpreter_times_never_as_ratios():
    from workflows.contracts import BestRef

    recs = [IterationRecord(iteration=1, candidate_id="c" * 16, source_key="k", outcome="improved", speedup=0.03,
                            time_ms=270.0, baseline_ms=8.0, interpreter=True, knobs={"BLOCK_N": 64}, rationale="r")]
    best = BestRef(candidate_id="c" * 16, source_key="k", speedup=0.03, time_ms=270.0, baseline_ms=8.0, iteration=1,
                   interpreter=True, knobs={"BLOCK_N": 64})
    text = summarize("softmax", 1, None, recs, recs, best)
    assert "270 ms of interpreter time (not GPU speed)" in text and "270 ms (interpreter)" in text
    assert "0.03x" not in text and "mean interpreter ms" in text
