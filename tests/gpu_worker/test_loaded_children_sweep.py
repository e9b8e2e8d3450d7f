"""Loaded children kept between stages expire on an idle worker too, not only when the next stage comes."""

from __future__ import annotations

import time

from gpu_worker.device.scheduling import LoadedChildren


class Child:  # what LoadedChildren uses of a Sandbox
    def __init__(self):
        self.closed = False

    def alive(self):
        return not self.closed

    def close(self):
        self.closed = True


def test_sweep_closes_the_children_past_their_ttl():
    kept = LoadedChildren(limit=4, ttl=0.1)
    a = Child()
    kept.put("a", a)
    time.sleep(0.2)
    assert kept.sweep() == 1 and a.closed and len(kept) == 0


def test_an_idle_worker_closes_its_kept_children_without_new_work():
    kept = LoadedChildren(limit=4, ttl=0.1)
    a, b = Child(), Child()
    kept.put("a", a)
    kept.put("b", b)
    kept.sweep_every(0.05)
    deadline = time.monotonic() + 5
    while not (a.closed and b.closed) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert a.closed and b.closed and len(kept) == 0


def test_sweep_keeps_children_within_their_ttl():
    kept = LoadedChildren(limit=4, ttl=60)
    a = Child()
    kept.put("a", a)
    assert kept.sweep() == 0 and not a.closed and kept.take("a") is a
