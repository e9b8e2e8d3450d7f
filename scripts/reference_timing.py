"""Time a problem's primary baseline with the reference child's own timing code (gpu_worker.child.Server in
the reference role), in this plain process or a sandboxed child: no worker, no other child. Set against a
benchmark's baseline figure, it says whether a difference lies in the timing code, the process the worker
runs it in, or the device's state: beside another process launching GPU work, as a benchmark's other child
is, a short baseline of several kernels reads faster (docs/results.md, Cross-examination).

    python scripts/reference_timing.py mla_decode [--shape 0] [--dist small] [--rounds 3] [--blocks 4] [--reps 20]
                                      [--sandboxed]

With --sandboxed the same requests go to a reference child the worker's way (gpu_worker.sandbox: its own
process, environment and limits), so the process is the only difference from a plain run.

Per round and variant: the median and minimum of `blocks` timed blocks, in microseconds. Variants: plain
blocks; with the per-repetition fingerprints a benchmark asks for; on handed entries as the baseline's
blocks get them; with one warm-up repetition instead of three; with the device-time floor a benchmark hands
on (the fastest repetition so far, which sizes the device's wait before a block). Last, the kernels the
baseline launched and their device time per call, by the profiler.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {"plain": {}, "fingerprint": {"check": True}, "entries+fingerprint": {"check": True, "entries": True},
            "one warm-up": {"warm": 1}, "floor": {"floor": True}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes")
    ap.add_argument("--dist", default=None, help="input distribution (default: the problem's first)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sandboxed", action="store_true", help="ask a reference child in its sandbox, as the worker does")
    a = ap.parse_args(argv)
    if min(a.rounds, a.blocks, a.reps) < 1:
        ap.error("--rounds, --blocks and --reps must be at least 1")

    import torch

    from baselines.registry import problem_at
    from gpu_worker.child import Server, serve
    from gpu_worker.sandbox import Sandbox

    try:
        _, shape, dist = problem_at(a.problem, a.shape, a.dist)
    except ValueError as e:
        ap.error(str(e))
    cuda = torch.cuda.is_available()

    with tempfile.TemporaryDirectory() as tmp:
        if a.sandboxed:
            child = Sandbox("reference", interpreter=not cuda)

            def ask(request):
                reply = child.call(request, timeout=600)
                if reply.failure is not None:
                    raise SystemExit(f"the reference child failed {request.cmd}: {reply.failure}")
                return reply.result
        else:
            child, srv = None, Server(tmp, "reference")

            def ask(request):
                return serve(srv, request)
        try:
            _run(a, ask, cuda, shape, dist)
        finally:
            if child is not None:
                child.close(graceful=True)
    return 0


def _run(a, ask, cuda: bool, shape, dist: str) -> None:
    from gpu_worker import protocol

    shape_name = shape.name if cuda else None  # None: the CPU shape, under the interpreter stand-in
    ask(protocol.CudaInit())
    setup = ask(protocol.Setup(problem=a.problem, shape=shape_name))
    cap = ask(protocol.Prepare(rotate=2, pool=3, dist=dist, seed=1000, capture=True)).captured
    mode = "cuda-graph" if cap is not None and cap.captured else "back-to-back"
    where = "a sandboxed reference child" if a.sandboxed else "reference role in this process"
    print(f"{a.problem} {setup.shape} {dist}: {setup.baseline}, {mode}, {where} "
          f"({'CUDA' if cuda else 'CPU: times say nothing about speed'})", flush=True)
    counter, fastest = [0], [0.0]

    def take(n: int) -> int:
        counter[0] += n
        return counter[0] - n

    def block(warm: int = 3, check: bool = False, entries: bool = False, floor: bool = False) -> list:
        kw = dict(reps=a.reps, warmup=warm, mode=mode, dist=dist, noise_seed=12345,
                  device_floor_ms=fastest[0] if floor else 0.0)
        if entries:
            kw.update(first=take(warm), entries=[take(1) for _ in range(a.reps)])
        else:
            kw["first"] = take(warm + a.reps)
        if check:
            kw["check_seed"] = 777
        times = ask(protocol.Time(**kw)).times
        fastest[0] = min(times) if not fastest[0] else min(fastest[0], *times)
        return times

    for r in range(a.rounds):
        for name, kw in VARIANTS.items():
            times = [t for _ in range(a.blocks) for t in block(**kw)]
            print(f"round {r} {name:<20} median {1e3 * statistics.median(times):8.2f} us  "
                  f"min {1e3 * min(times):8.2f}", flush=True)
    prof = ask(protocol.Profile(reps=10, dist=dist, noise_seed=12345, first=take(22)))
    print("kernels per call (profiler): " + (", ".join(f"{k} {1e3 * v:.2f} us" for k, v in prof.kernels.items())
                                             or "none seen"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
