"""The llm policy's notebook rewrite against the scripted server: what the deterministic notebook keeps
whatever the summarising model writes."""

from __future__ import annotations

import os
import pytest

from activities.llm.compaction import model_notes, rewrite_notebook
from activities.llm.endpoint import LlmSettings
from activities.notebook import summarize
from tests.llm.server import ChatServer, completion
from workflows.contracts import CompactRequest, IterationRecord


def worker_llm() -> LlmSettings:
    """The endpoint settings an agent worker started now would read."""
    return LlmSettings.from_env(os.environ)


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
        text, tin, tout = rewrite_notebook(req, deterministic, store, worker_llm())
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


def _previous(store, llm_env) -> str:
    """The key of a notebook version 1 with the model's notes, as rewrite_notebook writes it."""
    rec = IterationRecord(iteration=1, candidate_id="c" * 16, source_key="k", outcome="passed", speedup=1.2,
                          time_ms=1.0, baseline_ms=1.2, rationale="two rows per program")
    req = CompactRequest(workflow_id="w", problem="softmax", policy="llm", run=1, records=[rec])
    with ChatServer(lambda body, headers: completion("## What works\nNOTES-V1: two rows per program, 1.2x.",
                                                     prompt_tokens=300, completion_tokens=20)) as server:
        llm_env(server)
        text, _, _ = rewrite_notebook(req, summarize("softmax", 1, None, [rec], [rec], None), store, worker_llm())
    return store.put_text(text)


@pytest.mark.parametrize("reply,why", [
    (completion("## What works\n" + "Two rows per program help because the rows are short and " * 300,
                prompt_tokens=900, completion_tokens=4096, finish_reason="length"),
     "refused (it was cut off at the reply limit of 4096 tokens)"),
    (completion("## Next\n" + "- try BLOCK_N=1024 with num_warps=8\n" * 120, prompt_tokens=900, completion_tokens=1500),
     "refused (it repeats itself: one line is 120 of its 121 lines"),
    (completion("## Next\n" + "try BLOCK_N=1024 with num_warps=8 and " * 150, prompt_tokens=900,
                completion_tokens=1500),
     "refused (it repeats itself: it compresses to")])
def test_a_cut_off_or_repetitive_rewrite_is_refused_and_the_notes_kept(store, llm_env, reply, why):
    key = _previous(store, llm_env)
    with ChatServer(lambda body, headers: reply) as server:
        llm_env(server)
        rec = IterationRecord(iteration=2, candidate_id="d" * 16, source_key="k", outcome="rejected", stage="compile",
                              reason="BLOCK_N must be a power of 2", rationale="BLOCK_N=1000")
        req = CompactRequest(workflow_id="w", problem="softmax", policy="llm", run=1, records=[rec],
                             notebook_key=key, notebook_version=1)
        text, tin, tout = rewrite_notebook(req, summarize("softmax", 2, key, [rec], [rec], None), store, worker_llm())
    assert (tin, tout) == (reply.body["usage"]["prompt_tokens"], reply.body["usage"]["completion_tokens"])  # paid
    assert text.startswith("# Notebook: softmax, version 2") and "compile: BLOCK_N must be a power of 2" in text
    assert f"> The model's rewrite was {why}" in text and "the notes of version 1 are kept" in text
    assert "## The model's notes\n\n## What works\nNOTES-V1: two rows per program, 1.2x." in text
    notes = model_notes(text)
    assert notes == "## What works\nNOTES-V1: two rows per program, 1.2x."  # the refused text is not kept


def test_a_good_rewrite_is_taken():
    from activities.llm.compaction import degenerate

    notebook = ("## What works\n- two rows per program: 1.2x (iteration 3)\n- BLOCK_N=1024, 8 warps: 1.1x\n"
                "## What failed\n- BLOCK_N=1000: not a power of two\n- no max subtraction: exp overflow\n"
                "## Profiler\n- memory-bound at 2.1 of 4.8 TB/s; occupancy 38%\n## Next\n- three rows\n- 16 warps\n")
    assert degenerate(notebook * 3) is None and degenerate(notebook) is None


def test_after_a_budget_stop_the_final_rewrite_is_capped_or_skipped(store, llm_env):
    seen = []

    def respond(body, headers):
        seen.append(body)
        return completion("## What works\nNOTES-V2: three rows.", prompt_tokens=500, completion_tokens=30)

    key = _previous(store, llm_env)
    with ChatServer(respond) as server:
        llm_env(server).setenv("MARATHON_LLM_PROFILE", "openai-chat")  # a 16,384-token reply cap
        rec = IterationRecord(iteration=2, candidate_id="d" * 16, source_key="k", outcome="passed", speedup=1.3,
                              time_ms=0.9, baseline_ms=1.2, rationale="three rows")
        base = dict(workflow_id="w", problem="softmax", policy="llm", run=1, records=[rec], notebook_key=key,
                    notebook_version=1, final=True)
        det = summarize("softmax", 2, key, [rec], [rec], None)
        spent, tin, tout = rewrite_notebook(CompactRequest(**base, stopped_by="budget-tokens"), det, store, worker_llm())
        assert not seen and (tin, tout) == (0, 0)  # no call once the tokens are spent
        capped, _, _ = rewrite_notebook(CompactRequest(**base, stopped_by="budget-iterations"), det, store, worker_llm())
        normal, _, _ = rewrite_notebook(CompactRequest(**base, stopped_by="stop-signal"), det, store, worker_llm())
    assert "> The token budget is spent" in spent and "NOTES-V1" in spent
    assert [b["max_tokens"] for b in seen] == [1500, 16384]
    assert "NOTES-V2: three rows." in capped and "NOTES-V2: three rows." in normal
