"""A dispatcher that owns the device's schedule: device work is a queue of typed items, and the dispatcher,
not the caller, decides when each goes on the device.

* An `UntimedJob` (an upload, a verification call, a comparison) says what it is (`kind`) and, where it
  knows, how long it runs and how much device memory it takes; a job's expected duration is otherwise
  learned per kind from the durations seen (`Durations`).
* A `TimingBlock` runs with nothing else of ours on the device.

Timing windows batch the blocks of several candidates behind one drain of the jobs. A window is *due* once
`batch` blocks wait, or once the oldest has waited `max_wait_s`; from then on no job is admitted, the
running jobs end, and the waiting blocks run back to back, oldest first (blocks that arrive meanwhile
join while the window is younger than `window_s`, or while no job waits). Before a window is due, a job is
admitted only where it is expected to end before the window is: so a drain costs the jobs' overrun of
their expected times, not their whole length.

Neither side starves. Blocks: a due window admits no new job, and the jobs running are expected to end by
then. Jobs: every job waiting when a window closes is *owed* a turn: owed jobs start before any other, and
the next window is not due before each of them has started, whatever its expected length. Memory: with
`mem_gb`, jobs run beside each other only while their declared memory fits it (one alone always may). A
stage that runs out of memory anyway is retried alone (StageGate, as the device owner does).

The decisions are DispatchTurns' (gpu_worker.device.turns), given the time, which the schedule's simulator
(gpu_worker.device.schedule_sim) drives too; the turns are taken and held on the calling thread as DeviceOwner's
are (ThreadedTurns: `job()`, `timing()`, `run(item)`, `stage()`, `alone()`, and its counters), so heartbeats
and the phase log stay there.
"""

from __future__ import annotations

from gpu_worker.device.owner import ThreadedTurns
from gpu_worker.device.turns import DispatchTurns, Durations, Stretches, TimingBlock, UntimedJob, window_due
from workflows.metrics import add_gpu_busy, add_gpu_closed

__all__ = ["DeviceDispatcher", "Durations", "TimingBlock", "UntimedJob", "window_due"]


class DeviceDispatcher(ThreadedTurns):
    """See the module's docstring: DispatchTurns' decisions, threaded."""

    def __init__(self, max_jobs: int = 4, batch: int = 2, max_wait_s: float = 1.0, window_s: float = 4.0,
                 mem_gb: float | None = None, durations: Durations | None = None, beside: int = 0):
        super().__init__(DispatchTurns(max_jobs, batch, max_wait_s, window_s, mem_gb, durations,
                                       Stretches(add_gpu_busy, add_gpu_closed)), beside)

    batch = property(lambda self: self.turns.batch)
    max_wait_s = property(lambda self: self.turns.max_wait_s)
    mem_gb = property(lambda self: self.turns.mem_gb)
    durations = property(lambda self: self.turns.durations)
