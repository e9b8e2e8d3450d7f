"""Time a problem's primary baseline with the reference child's own timing code (gpu_worker.child.Server in
the reference role), in this plain process: no sandbox, no worker, no other child. Set against a benchmark's
baseline figure, it says whether a difference lies in the timing code or in the process the worker runs it in.

    python scripts/reference_timing.py mla_decode [--shape 0] [--dist small] [--rounds 3] [--blocks 4] [--reps 20]

Per round and variant: the median and minimum of `blocks` timed blocks, in microseconds. Variants: plain
blocks; with the per-repetition fingerprints a benchmark asks for; on handed entries as the baseline's
blocks get them; with one warm-up repetition instead of three.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = {"plain": {}, "fingerprint": {"check": True}, "entries+fingerprint": {"check": True, "entries": True},
            "one warm-up": {"warm": 1}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes")
    ap.add_argument("--dist", default=None, help="input distribution (default: the problem's first)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    if min(a.rounds, a.blocks, a.reps) < 1:
        ap.error("--rounds, --blocks and --reps must be at least 1")

    import torch

    from baselines.registry import problem_at
    from gpu_worker import protocol
    from gpu_worker.child import Server, serve

    try:
        p, shape, dist = problem_at(a.problem, a.shape, a.dist)
    except ValueError as e:
        ap.error(str(e))
    cuda = torch.cuda.is_available()
    shape_name = shape.name if cuda else None  # None: the CPU shape, under the interpreter stand-in

    with tempfile.TemporaryDirectory() as tmp:
        srv = Server(tmp, "reference")
        serve(srv, protocol.CudaInit())
        setup = serve(srv, protocol.Setup(problem=a.problem, shape=shape_name))
        serve(srv, protocol.Prepare(rotate=2, pool=3, dist=dist, seed=1000))
        cap = serve(srv, protocol.Capture(dist=dist))
        mode = "cuda-graph" if cap.captured else "back-to-back"
        print(f"{a.problem} {setup.shape} {dist}: {setup.baseline}, {mode}, reference role in this process "
              f"({'CUDA' if cuda else 'CPU: times say nothing about speed'})", flush=True)
        counter = [0]

        def take(n: int) -> int:
            counter[0] += n
            return counter[0] - n

        def block(warm: int = 3, check: bool = False, entries: bool = False) -> list:
            kw = dict(reps=a.reps, warmup=warm, mode=mode, dist=dist, noise_seed=12345)
            if entries:
                kw.update(first=take(warm), entries=[take(1) for _ in range(a.reps)])
            else:
                kw["first"] = take(warm + a.reps)
            if check:
                kw["check_seed"] = 777
            return serve(srv, protocol.Time(**kw)).times

        for r in range(a.rounds):
            for name, kw in VARIANTS.items():
                times = [t for _ in range(a.blocks) for t in block(**kw)]
                print(f"round {r} {name:<20} median {1e3 * statistics.median(times):8.2f} us  "
                      f"min {1e3 * min(times):8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
