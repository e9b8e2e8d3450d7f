"""The Evaluator itself (gpu_worker.harness): warm-up fills the oracle bank and the input bank (which the
candidates read and the fingerprint guards), and the interpreter's profile."""

from __future__ import annotations

import pytest

from tests.gpu_worker.harnesses import canary, req


def test_warm_fills_oracle_bank(store):
    import gpu_worker.harness as h
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings

    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(seed_pool=3))
    try:
        w = e.warm("softmax")
        assert w["oracles"] == 6 and len(e.refs.meta) == 6
        # a later verification needs no new oracle: every case hits the bank
        before = dict(e.refs.meta)
        v = e.verify(req(store, canary("fast")))
        assert v.ok and set(e.refs.meta) == set(before)
    finally:
        e.close()


@pytest.mark.slow(40)
def test_input_bank_written_by_reference_read_by_candidates(store, tmp_path):
    """The reference child leaves each case's inputs in the bank (read-only); candidate children read
    them there. The reference never reads the bank, so an altered bank file is caught by the fingerprint."""
    import torch

    import gpu_worker.harness as h
    from gpu_worker.device.scheduling import Scheduler
    from baselines.registry import get_problem
    from gpu_worker.settings import GpuWorkerSettings

    e = h.Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0),
                    settings=GpuWorkerSettings(gpu_workdir=tmp_path, seed_pool=3))
    try:
        e.warm("softmax")
        bank = sorted((tmp_path / "input-bank").glob("*.pt"))
        # one file per pool case, plus each distribution's timing values the warm-up prepared
        dists = len(get_problem("softmax").distributions)
        assert len(bank) == 3 * dists + dists * e.ctx.plan()["pool"]
        assert all(p.stat().st_mode & 0o777 == 0o444 for p in bank)
        assert e.verify(req(store, canary("fast"))).ok
        for p in bank:
            p.chmod(0o644)
            x = torch.load(p, weights_only=True)
            name = next(k for k, v in x.items() if isinstance(v, torch.Tensor))
            x[name] = x[name] + 1
            torch.save(x, p)
        v = e.verify(req(store, canary("slow")))
        assert not v.ok and "inputs differ" in v.reason, v.reason
    finally:
        e.close()


def test_profile_interpreter(ev, store):
    p = ev.profile(req(store, canary("fast")))
    assert p.ok and "interpreter" in p.summary and p.bound == "unknown"
