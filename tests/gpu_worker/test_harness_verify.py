"""The verify stage (gpu_worker.harness.verify) on the Triton interpreter: honest kernels pass, every
cheating family it checks for is rejected with the right reason (the cheats judged by `judge`/`judge_raw`:
on the interpreter and, where CUDA is, on the GPU too), and it reports where its time went."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, kernel, req


@pytest.mark.parametrize("name", ["slow", "fast"])
def test_honest_canaries_pass(ev, store, name):
    v = ev.verify(req(store, canary(name)))
    assert v.ok, v.reason


def test_named_shape_and_unknown_shape(ev, store):
    r = req(store, canary("fast"))
    v = ev.verify(r.model_copy(update={"shape": "M16 N300"}))
    assert v.ok, v.reason
    v = ev.verify(r.model_copy(update={"shape": "nonexistent"}))
    assert not v.ok and "no shape" in v.reason


@pytest.mark.parametrize("source,stage,reason", [
    ("canary:wrong", "verify", ("wrong", "non-finite")),               # precision/overflow: wide inputs
    ("canary:cheat", "verify", ("input-mutation",)),                   # family 2: mutates inputs
    ("input_swap_hides_mutation", "verify", ("input-mutation",)),      # ... and hands an untouched copy back
    ("unwritten", "verify", ("non-finite",)),                          # family 11: skipped elements (NaN poison)
    ("shape_cache", "verify", ("wrong", "output-cache", "non-finite", "degenerate")),  # family 6/10: cached
    # result replayed; on a GPU the first result it caches is the compile's (Triton's warmup path runs no
    # kernel, so it caches unwritten memory: NaN, zeros or garbage, whatever the allocator handed out)
    ("zeros", "verify", ("wrong", "degenerate")),                      # family 9: zero output
    ("nondeterministic", "verify", ("nondeterministic", "wrong")),     # family 11: differs on rerun, or on
                                                                         # a compared case
])
def test_cheating_families_rejected(judge, store, source, stage, reason):
    text = canary(source.split(":")[1]) if source.startswith("canary:") else kernel(source)
    v = judge.verify(req(store, text))
    assert not v.ok
    assert v.stage == stage, v
    assert v.reason.startswith(reason), v.reason
    assert v.log_key is not None


@pytest.mark.parametrize("name,option", [("config_compile_options", "extern_libs, ir_override"),
                                         ("heuristic_compile_options", "ptx_options")])
def test_compile_options_reaching_a_launch_by_a_config_or_a_heuristic_are_refused(judge_raw, store, name, option):
    """Behind the rules (which refuse such keys where they can read them): the launch refuses them, however
    they came (a dict's keys, one built at run time)."""
    r = req(store, kernel(name))
    c = judge_raw.compile(r)
    assert not c.ok and f"launch option {option}:" in c.error, c


def test_late_write_rejected(judge_raw, store):
    # the thread that writes the answer after the call returned is still alive when it returns: refused at
    # once (the run-time guard); behind it, outputs are snapshotted right after each call and the buffers
    # must still match them when the worker exports them (`late-write`)
    v = judge_raw.verify(req(store, kernel("late_write")))
    assert not v.ok and v.stage in ("rules", "verify"), v
    assert v.reason.startswith(("lazy-output", "late-write")), v.reason
    assert "thread" in v.reason or v.reason.startswith("late-write"), v.reason


def test_an_output_buffer_replaced_instead_of_written_is_rejected(judge, store):
    v = judge.verify(req(store, kernel("replaced_output")))
    assert not v.ok and v.reason.startswith("output-type: run must write into the tensors it is given"), v


def test_verification_reports_where_its_time_went(ev, store):
    # the activity wrapper logs these phases with every GPU activity (scripts/phase_summary.py reads them)
    from gpu_worker.phases import phases_begin, phases_end

    phases_begin()
    v = ev.verify(req(store, canary("fast")))
    ph = phases_end()
    assert v.ok, v.reason
    assert "load" in ph or ph.get("handed-on") == 1, ph  # loaded here, or by an earlier compile of it
    for name in ("reference", "run-cases", "run-cases.prepare.upload", "run-cases.first-call", "run-cases.export",
                 "run-cases.rerun", "run-cases.stale", "run-cases.download", "export-write", "compare",
                 "compare.import", "compare.oracle-and-math"):
        assert name in ph and ph[name] >= 0, (name, ph)
    assert ph["run-cases"] >= ph["run-cases.first-call"]
    assert phases_end() == {}  # collected once


@pytest.mark.parametrize("name,where", [("resized_output", "seed"),           # every call: other shape, same buffer
                                        ("rerun_removed_output", "rerun")])   # the rerun's output removed
def test_an_output_left_other_than_its_buffer_is_the_candidate_s_rejection(judge, store, name, where):
    """An output resized in place (a torch call's `out=`) or removed where only the determinism rerun sees
    it: the reference child compares like with like, so this is refused before it, as the candidate's
    `output-type`, never a failure of the trusted child (a harness error, retried, then pausing the run)."""
    v = judge.verify(req(store, kernel(name)))
    assert not v.ok and v.stage == "verify", v
    assert v.reason.startswith("output-type: run must write into the tensors it is given"), v.reason
    assert where in v.reason, v.reason
