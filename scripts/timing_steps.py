"""Time one problem's starting kernel and its primary baseline with the harness's timing steps added one at
a time, in one process: what each step (the L2 flush, static sets, refill and NaN poison, the flush as a
graph) adds to a figure. Trusted code only, medians of graph replays in microseconds.

    python scripts/timing_steps.py mla_decode [--shape 0] [--dist unit] [--knobs '{"PDL": false}'] [--rounds 2]

Steps, each the work's CUDA graph replayed between two events with the host far ahead:
  rotated            a graph per rotated input copy (gpu_worker.devicetime, the independent check)
  rotated+flush      the same, the harness's L2 flush on the stream before each replay
  static+flush       two static sets (the harness's), the flush on the stream
  static+refill      two static sets refilled (a pool set perturbed, as timed repetitions are) and
                     NaN-poisoned, then the flush on the stream
  static+memset      two static sets, a one-element memset before each replay (stream work, no flush)
  static+graphflush  two static sets, the flush replayed as a graph
  harness            refill and poison, then the flush as a graph: what the harness does now
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes")
    ap.add_argument("--dist", default=None, help="input distribution (default: the problem's first)")
    ap.add_argument("--knobs", action="append", default=[],
                    help="JSON object of knob overrides: one more variant of the starting kernel (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=60)
    a = ap.parse_args(argv)

    import torch

    from baselines.registry import check_problem_name, get_problem
    from gpu_worker.devicetime import cold_bytes, graph_time_ms, rotated_copies
    from gpu_worker.timing_inputs import FreshValues

    try:
        check_problem_name(a.problem)
    except ValueError as e:
        ap.error(str(e))
    p = get_problem(a.problem)
    if not 0 <= a.shape < len(p.shapes):
        ap.error(f"--shape {a.shape}: {a.problem} has shapes 0..{len(p.shapes) - 1}")
    shape = p.shapes[a.shape]
    dist = a.dist or p.distributions[0]
    if dist not in p.distributions:
        ap.error(f"--dist {dist}: {a.problem}'s distributions are {', '.join(p.distributions)}")
    variants = {"defaults": {}}
    for text in a.knobs:
        try:
            kn = json.loads(text)
        except ValueError as e:
            ap.error(f"--knobs {text}: {e}")
        if not isinstance(kn, dict):
            ap.error(f"--knobs {text}: not a JSON object")
        try:
            p.render({**p.default_knobs(), **kn})
        except ValueError as e:
            ap.error(f"--knobs {text}: {e}")
        variants[json.dumps(kn, sort_keys=True)] = kn
    if not torch.cuda.is_available():
        ap.error("the timing steps need a CUDA device")

    flush = torch.zeros(cold_bytes() // 4, dtype=torch.float32, device="cuda")
    sink = torch.zeros((), dtype=torch.float32, device="cuda")
    tiny = torch.zeros(1, device="cuda")

    def stream_flush():
        torch.sum(flush, 0, out=sink)

    torch.cuda.synchronize()
    flush_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(flush_graph):
        stream_flush()
    torch.cuda.synchronize()

    def outputs():
        return {k: torch.empty(o.shape, dtype=getattr(torch, o.dtype), device="cuda")
                for k, o in p.output_specs(shape).items()}

    rotated = [{"inputs": inp, "out": outputs()}
               for inp in rotated_copies(lambda i: p.make_inputs(shape, dist, 9000 + i, "cuda"))]
    static = [{"inputs": p.make_inputs(shape, dist, 100 + i, "cuda"), "out": outputs()} for i in range(2)]
    pool = [p.make_inputs(shape, dist, 200 + i, "cuda") for i in range(3)]
    fresh = FreshValues(p.perturbed, dist, "cuda", torch.Generator)

    def refill(s, i):  # as the harness does: a pool set perturbed by draws of this repetition's own
        vals = fresh(pool, i, 1)
        for k, v in s["inputs"].items():
            if isinstance(v, torch.Tensor):
                v.copy_(vals[k])
        for v in s["out"].values():
            if v.is_floating_point():
                v.fill_(float("nan"))

    steps = {
        "rotated": (rotated, lambda s, i: None),
        "rotated+flush": (rotated, lambda s, i: stream_flush()),
        "static+flush": (static, lambda s, i: stream_flush()),
        "static+refill": (static, lambda s, i: (refill(s, i), stream_flush())),
        "static+memset": (static, lambda s, i: tiny.zero_()),
        "static+graphflush": (static, lambda s, i: flush_graph.replay()),
        "harness": (static, lambda s, i: (refill(s, i), flush_graph.replay())),
    }

    def median_us(call, sets, before) -> float:
        res = graph_time_ms(call, sets, reps=a.reps, before=lambda i: before(sets[i % len(sets)], i))
        if res["mode"] != "cuda-graph":
            raise SystemExit(f"timing_steps.py: {a.problem}'s work does not capture as a CUDA graph")
        return res["ms"] * 1e3

    with tempfile.TemporaryDirectory() as tmp:
        calls = {}
        for n, (name, kn) in enumerate(variants.items()):
            path = Path(tmp) / f"variant_{n}.py"
            path.write_text(p.render({**p.default_knobs(), **kn}))
            spec = importlib.util.spec_from_file_location(f"variant_{n}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            calls[name] = lambda s, m=mod: m.run(s["inputs"], s["out"])
        primary = next(iter(p.baselines().items()))
        calls[primary[0]] = lambda s, b=primary[1]: b(s["inputs"])
        print(f"{a.problem} {shape.name} {dist}, microseconds, medians of {a.reps} replays (gpu_worker.devicetime)", flush=True)
        print(f"{'side':<28}" + "".join(f"{k:>19}" for k in steps), flush=True)
        for _ in range(a.rounds):
            for name, call in calls.items():
                row = [median_us(call, sets, before) for sets, before in steps.values()]
                print(f"{name[:28]:<28}" + "".join(f"{x:>19.2f}" for x in row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
