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
  rotated+graphflush a graph per rotated input copy, the flush as a graph before each replay (the work's
                     code evicted from L2, its inputs as cold as without it)
  rotated+code       rotated copies, a kernel of ~120 KB of instructions and no data before each replay (the
                     SMs' instruction caches refilled with other code, L2 untouched)
  rotated+both       rotated copies, the code kernel then the flush as a graph
  harness+code       the harness's steps with the code kernel ahead of the refill, where a timed repetition
                     has the previous one's fingerprint and other kernels
  harness+fingerprint the harness's steps after the reference role's fingerprint of an output (fp32 dot
                     products onto a random vector, and the sum of squares)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = ("rotated", "rotated+flush", "static+flush", "static+refill", "static+memset", "static+graphflush",
         "harness", "rotated+graphflush", "rotated+code", "rotated+both", "harness+code", "harness+fingerprint")
CODE_STEPS = 4096  # unrolled multiply-adds with distinct constants: ~30 bytes of instructions each (sm_90)


def _code_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def code_only(x_ptr, STEPS: tl.constexpr):
        offs = tl.arange(0, 128)
        x = tl.load(x_ptr + offs)
        for i in tl.static_range(STEPS):
            x = x * (1.0 + i * 1e-7) + i * 1e-5
        tl.store(x_ptr + offs, x)

    return code_only


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem")
    ap.add_argument("--shape", type=int, default=0, help="index into the problem's shapes")
    ap.add_argument("--dist", default=None, help="input distribution (default: the problem's first)")
    ap.add_argument("--knobs", action="append", default=[],
                    help="JSON object of knob overrides: one more variant of the starting kernel (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps to time (default: all)")
    a = ap.parse_args(argv)
    chosen = [x for x in a.steps.split(",") if x]
    unknown = [x for x in chosen if x not in STEPS]
    if unknown or not chosen:
        ap.error(f"--steps: unknown {', '.join(unknown) or '(none given)'} (steps: {', '.join(STEPS)})")

    import torch

    from baselines.registry import problem_at
    from gpu_worker.devicetime import cold_bytes, graph_time_ms, rotated_copies
    from gpu_worker.timing_inputs import FreshValues, entry_seed

    try:
        p, shape, dist = problem_at(a.problem, a.shape, a.dist)
    except ValueError as e:
        ap.error(str(e))
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

    code_only, code_buf = _code_kernel(), torch.zeros(128, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def code():  # every SM runs the whole instruction stream
        code_only[(4 * sms,)](code_buf, STEPS=CODE_STEPS, num_warps=4)

    code()
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
        vals = fresh(pool, i, entry_seed(1, i))
        for k, v in s["inputs"].items():
            if isinstance(v, torch.Tensor):
                v.copy_(vals[k])
        for v in s["out"].values():
            if v.is_floating_point():
                v.fill_(float("nan"))

    fp_vecs = {k: torch.randn(v.numel(), device="cuda") for k, v in static[0]["out"].items()}

    def fingerprint(s):  # as the reference child's, after each repetition: dot products of the outputs
        for k, v in s["out"].items():
            part = v.reshape(-1).float()
            torch.dot(part, fp_vecs[k]) + torch.dot(part, part)

    steps = {
        "rotated": (rotated, lambda s, i: None),
        "rotated+flush": (rotated, lambda s, i: stream_flush()),
        "static+flush": (static, lambda s, i: stream_flush()),
        "static+refill": (static, lambda s, i: (refill(s, i), stream_flush())),
        "static+memset": (static, lambda s, i: tiny.zero_()),
        "static+graphflush": (static, lambda s, i: flush_graph.replay()),
        "harness": (static, lambda s, i: (refill(s, i), flush_graph.replay())),
        "rotated+graphflush": (rotated, lambda s, i: flush_graph.replay()),
        "rotated+code": (rotated, lambda s, i: code()),
        "rotated+both": (rotated, lambda s, i: (code(), flush_graph.replay())),
        "harness+code": (static, lambda s, i: (code(), refill(s, i), flush_graph.replay())),
        "harness+fingerprint": (static, lambda s, i: (fingerprint(s), refill(s, i), flush_graph.replay())),
    }

    steps = {k: v for k, v in steps.items() if k in chosen}

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
