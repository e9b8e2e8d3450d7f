"""The Evaluator's default scheduler for one caller at a time (gpu_worker.harness.serial)."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, req


@pytest.mark.slow(35)
def test_the_serial_default_gives_the_scheduled_verdicts(ev, store):
    """An Evaluator without a scheduler: no device owner, no spares, no hand-on; same verdicts."""
    from gpu_worker.harness import Evaluator
    from gpu_worker.harness.serial import SerialScheduler

    serial = Evaluator(store=store, interpreter=True, timeouts={"verify": 40, "compile": 60})
    try:
        assert isinstance(serial.sched, SerialScheduler) and not serial.owner.retries_alone
        for name in ("fast", "wrong"):
            r = req(store, canary(name))
            got, want = serial.verify(r), ev.verify(r)
            assert (got.ok, got.stage) == (want.ok, want.stage), name
            assert len(serial.loaded) == 0  # nothing waits between stages
    finally:
        serial.close()
