"""What a timed repetition's refill costs: a pool set perturbed with draws of its own (Problem.perturbed)
and copied into the static buffers, outside the timed interval. Per problem and distribution: device ops,
bytes the ops read and write (counted per op from their tensors), the inputs' bytes, and milliseconds per
repetition (CUDA events on a GPU; perf_counter under the CPU, which says nothing about a GPU).

    python scripts/refill_cost.py [PROBLEM ...] [--shape 0] [--json]

Default: every built-in problem, at its primary shape on a GPU (the cpu_shape without CUDA); a problem may
be a KernelBench file's path.
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
    a = ap.parse_args(argv)

    import torch

    from baselines.external.file import load_file
    from baselines.registry import get_problem
    from gpu_worker.timing_inputs import refill_cost

    cuda = torch.cuda.is_available()
    if not a.json:
        print(f"{'problem':<14} {'shape':<26} {'dist':<8} {'ops':>5} {'MB moved':>10} {'MB inputs':>10} "
              f"{'x inputs':>8} {'ms':>9}   ({'GPU' if cuda else 'CPU, no GPU figure'})")
    for name in a.problems:
        p = load_file(name)[2] if name.endswith(".py") else get_problem(name)
        shape = p.shapes[a.shape] if cuda else p.cpu_shape
        for dist in p.distributions:
            r = refill_cost(p, shape, dist, "cuda" if cuda else "cpu", cpu=not cuda, reps=a.reps)
            if a.json:
                print(json.dumps({"problem": p.name[:20], "shape": shape.name, "dist": dist, "device": "cuda" if cuda
                                  else "cpu", **r}))
            else:
                print(f"{p.name[:14]:<14} {shape.name[:26]:<26} {dist:<8} {r['ops']:>5} {r['bytes'] / 1e6:>10.2f} "
                      f"{r['input_bytes'] / 1e6:>10.2f} {r['bytes'] / max(r['input_bytes'], 1):>8.1f} {r['ms']:>9.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
