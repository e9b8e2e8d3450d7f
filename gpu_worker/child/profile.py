"""A child's profiler view of its timed work (`profile`, a new best's cross-check): torch.profiler's kernel
time per call, measured over the same steps as a timed block (gpu_worker.child.timing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_worker import protocol

if TYPE_CHECKING:
    from gpu_worker.child.core import ChildCore
    from gpu_worker.child.timing import ChildTiming


class ChildProfiling:
    """The profiler's view, on the timing sets of the child's timing part. Built with the core and the timing."""

    PINNED = ("core", "timing")  # by identity (ChildCore.pin_trusted)

    def __init__(self, core: ChildCore, timing: ChildTiming):
        self.core, self.timing = core, timing

    def cmd_profile(self, reps: int = 10, dist: str | None = None, noise_seed: int | None = None, first: int = 0):
        """torch.profiler (CUPTI) over the timed loop's steps, once with the work and once without it: the
        difference is the work's device kernel time per call, which the worker compares with the judged
        device time. Also returns the kernel names the work launched. Each refill takes the next entry from
        `first` on (2 + 2 x reps of them)."""
        from torch.profiler import ProfilerActivity, profile

        core, timing = self.core, self.timing
        ts = timing._timing_set(dist, "profile")
        fn = timing._fn()
        rotate = len(ts.sets)
        key_of = timing._key_source(noise_seed, first)
        entry = iter(range(first, first + 2 + 2 * reps))
        for i in range(2):
            e = next(entry)
            timing._before_rep(ts, i % rotate, e, key_of(None, e))
            fn(*ts.sets[i % rotate])
        core._sync()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if core.cuda else [])

        def device_events(with_work: bool) -> dict:
            with profile(activities=acts) as prof:
                for i in range(reps):
                    e = next(entry)
                    timing._before_rep(ts, i % rotate, e, key_of(None, e))
                    if with_work:
                        fn(*ts.sets[i % rotate])
                core._sync()
            kernels: dict[str, list] = {}
            for ev in prof.events():
                if core.cuda and "CUDA" in str(getattr(ev, "device_type", "")) \
                        and getattr(ev, "device_time", None) is not None:
                    k = kernels.setdefault(ev.name, [0.0, 0])
                    k[0] += ev.device_time / 1e3  # us -> ms
                    k[1] += 1
            return kernels

        with_work, without = device_events(True), device_events(False)
        total = (sum(v[0] for v in with_work.values()) - sum(v[0] for v in without.values())) / reps
        launches = (sum(v[1] for v in with_work.values()) - sum(v[1] for v in without.values())) / reps
        work = {k: (v[0] - without.get(k, [0.0, 0])[0]) / reps for k, v in with_work.items()
                if v[1] > without.get(k, [0.0, 0])[1]}
        return protocol.Profiled(kernels=work, kernel_ms_per_call=total, launches_per_call=launches)
