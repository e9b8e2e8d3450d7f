"""A device-time measurement apart from the harness's protocol: one CUDA graph per rotated copy of the
inputs (enough copies to hold `cold_bytes()`, as much as the harness's L2 flush reads, so every replay
reads memory as cold as a judged repetition does), replayed back to back with
events around each replay. Nothing is written between replays, where a judged repetition follows the refill
of its static buffers and the flush: a kernel of tens of microseconds reads about a microsecond faster here
(docs/results.md, Cross-examination). Trusted code only (baselines, the project's own kernels): it neither refills
inputs nor checks outputs. The scoreboard times secondary baselines with it, and
scripts/device_time_check.py uses it to cross-examine the scoreboard in a process of its own."""

from __future__ import annotations

import statistics


def rotated_copies(make) -> list:
    """Input sets from `make(i)` until together they hold at least `cold_bytes()` (at least two)."""
    import torch

    target = cold_bytes()
    sets, total = [], 0
    while len(sets) < 2 or total < target:
        s = make(len(sets))
        sets.append(s)
        total += sum(v.numel() * v.element_size() for v in s.values() if isinstance(v, torch.Tensor))
    return sets


def graph_time_ms(call, sets: list, reps: int = 50, before=None) -> dict:
    """Median device milliseconds of `call(inputs)` replayed as one CUDA graph per input set; falls back to
    back-to-back eager calls behind a device-side wait when the call does not capture. `before(i)`, if
    given, queues untimed work ahead of repetition i (on set i % len(sets)), outside its events."""
    import torch

    for s in sets:  # lazy initialisation and autotuning before capture
        call(s)
    torch.cuda.synchronize()
    mode = "cuda-graph"
    try:
        graphs = []
        for s in sets:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call(s)
            graphs.append(g)
        torch.cuda.synchronize()
        launches = [g.replay for g in graphs]
    except Exception:  # noqa: BLE001 - a call that does not capture is timed eagerly
        torch.cuda.synchronize()
        mode = "back-to-back"
        launches = [(lambda s=s: call(s)) for s in sets]
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(len(sets)):
        launches[i]()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s: the host queues every replay before the device reaches it
    for i in range(reps):
        if before is not None:
            before(i)
        starts[i].record()
        launches[i % len(sets)]()
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return {"ms": statistics.median(times), "mode": mode, "reps": reps, "copies": len(sets),
            "iqr_ms": tuple(statistics.quantiles(times, n=4)[::2])}


def l2_bytes() -> int:
    import torch

    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20))


def cold_bytes() -> int:
    """How much other memory is read between two uses of one input for it to be cold: twice L2, and at
    least 256 MiB. The harness's L2 flush reads this much before every repetition; rotated copies hold it."""
    return max(2 * l2_bytes(), 256 << 20)
