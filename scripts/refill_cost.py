"""What a timed repetition's refill costs: a pool set perturbed with draws of its own (Problem.perturbed)
and copied into the static buffers, outside the timed interval. Per problem and distribution: device ops,
bytes the ops read and write (counted per op from their tensors), the inputs' bytes, and milliseconds per
repetition (CUDA events on a GPU; perf_counter under the CPU, which says nothing about a GPU).

    python scripts/refill_cost.py [PROBLEM ...] [--shape 0] [--json]
    python scripts/refill_cost.py kda --window        # and its share of a benchmark's timing window (GPU)

Default: every built-in problem, at its primary shape on a GPU (the cpu_shape without CUDA); a problem may
be a KernelBench file's path. `--window` then benchmarks each built-in problem's starting kernel through the
harness against itself as the best (so no block is cut short), twice after a first call that warms the
baseline, and prints the timing window (`BenchReport.gpu_seconds`) and the share its refills take: per
distribution the baseline's probe, each side's timed repetitions (the report's samples) with their warm-ups,
and the host-latency calls, each refilled once (the warm-ups counted at the plan's blocks: about, where a slow
baseline gets fewer).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", default=["softmax", "kda", "mla_decode", "mla_prefill"])
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes (GPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ap.add_argument("--window", action="store_true", help="also the refills' share of a benchmark's timing "
                    "window (a GPU; built-in problems at their primary shape)")
    a = ap.parse_args(argv)
    if a.window and (a.shape != 0 or any(n.endswith(".py") for n in a.problems)):
        ap.error("--window times built-in problems at their primary shape")

    import torch

    from baselines.external.file import load_file
    from baselines.registry import get_problem
    from gpu_worker.timing_inputs import refill_cost

    cuda = torch.cuda.is_available()
    if a.window and not cuda:
        ap.error("--window needs a GPU: the timing window is device time")
    refill_ms = {}
    if not a.json:
        print(f"{'problem':<14} {'shape':<26} {'dist':<8} {'ops':>5} {'MB moved':>10} {'MB inputs':>10} "
              f"{'x inputs':>8} {'ms':>9}   ({'GPU' if cuda else 'CPU, no GPU figure'})")
    for name in a.problems:
        p = load_file(name)[2] if name.endswith(".py") else get_problem(name)
        shape = p.shapes[a.shape] if cuda else p.cpu_shape
        for dist in p.distributions:
            r = refill_cost(p, shape, dist, "cuda" if cuda else "cpu", cpu=not cuda, reps=a.reps)
            refill_ms[(p.name, dist)] = r["ms"]
            if a.json:
                print(json.dumps({"problem": p.name[:20], "shape": shape.name, "dist": dist, "device": "cuda" if cuda
                                  else "cpu", **r}))
            else:
                print(f"{p.name[:14]:<14} {shape.name[:26]:<26} {dist:<8} {r['ops']:>5} {r['bytes'] / 1e6:>10.2f} "
                      f"{r['input_bytes'] / 1e6:>10.2f} {r['bytes'] / max(r['input_bytes'], 1):>8.1f} {r['ms']:>9.4f}")
    if a.window:
        window_share(a.problems, refill_ms, a.json)
    return 0


def window_share(problems: list[str], refill_ms: dict, as_json: bool) -> None:
    """Each problem's starting kernel benchmarked against itself as the best: the timing window and the
    refills' part of it (their count from the harness's plan and the report's samples)."""
    import hashlib
    import tempfile

    from baselines.registry import get_problem
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.harness import Evaluator
    from gpu_worker.settings import GpuWorkerSettings
    from workflows.artifacts import ArtifactStore
    from workflows.contracts import BenchRequest, BestRef

    ev = Evaluator(store=ArtifactStore(tempfile.mkdtemp()), interpreter=False, scheduler=Scheduler(spares=1),
                   settings=GpuWorkerSettings(ncu_proof_share=0.0))
    plan = ev.ctx.plan()
    try:
        for name in problems:
            p = get_problem(name)
            source = p.render(p.default_knobs())

            def put(tag: str) -> tuple[str, str]:
                text = f"{source}\n# {tag}\n"  # a candidate of its own each time, no child handed on
                return hashlib.sha256(text.encode()).hexdigest()[:16], ev.store.put_text(text)

            best_id, best_key = put("the best")
            best = BestRef(candidate_id=best_id, source_key=best_key, speedup=1.0, time_ms=1.0, baseline_ms=1.0,
                           iteration=1)
            for i in range(3):
                cid, key = put(f"window {i}")
                b = ev.benchmark(BenchRequest(problem=name, candidate_id=cid, source_key=key, best=best))
                if not b.ok:
                    raise SystemExit(f"{name}: the starting kernel's benchmark failed: {b.reason[:500]}")
                if i == 0:
                    continue  # the baseline's first call (autotuning) and the children's starts
                # per distribution: the baseline's probe (3 calls and a warm-up), three sides' timed calls with
                # their warm-ups (the first block's and one a later block), two sides' host-latency calls
                refills = {d.dist: 4 + 3 * (d.samples + plan["warmup"] + plan["blocks"] - 1) + 2 * plan["host_reps"]
                           for d in b.distributions}
                refill_s = sum(n * refill_ms[(p.name, dist)] for dist, n in refills.items()) / 1e3
                row = {"problem": name, "window_s": b.gpu_seconds, "refills": refills, "refill_s": refill_s,
                       "share": refill_s / b.gpu_seconds,
                       "samples": {d.dist: d.samples for d in b.distributions}}
                print(json.dumps(row) if as_json else
                      f"{name}: timing window {b.gpu_seconds:.3f} s, {sum(refills.values())} refills "
                      f"{refill_s:.3f} s: {100 * row['share']:.0f}% (samples a side {row['samples']})")
    finally:
        ev.close()


if __name__ == "__main__":
    raise SystemExit(main())
