"""Does host CPU load change a kernel's measured time? FLA's chunk_kda measured 1.15-1.75 ms inside the
search runs of 2026-11-30 (docs/throughput.md) against 1.2 ms on a quiet host, while our two-launch kernel
barely moved. The hypothesis: a many-launch baseline is host-bound between its launches, so every busy
core (candidate compiles) slows it; CUDA-graph replay removes the host from the measurement.

This times the KDA primary baseline and the starting kernel on the primary shape, eagerly (events around
each call, L2 flushed between calls) and as CUDA-graph replays, first on a quiet host and then with
`--burners` processes spinning on the CPU, and prints the medians and spreads (JSON to $OUT/host_load.json).

    python scripts/gpu_host_load.py [--reps 40] [--burners 28]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timings(fn, reps: int, graph: bool) -> list[float]:
    import torch

    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    if graph:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm-up on the side stream, as capture requires
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        call = g.replay
    else:
        call = fn
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 4), "p10": round(xs[len(xs) // 10], 4),
            "p90": round(xs[(9 * len(xs)) // 10], 4), "n": len(xs)}


def main() -> int:
    import torch

    from baselines.registry import get_problem

    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--burners", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    a = ap.parse_args()
    p = get_problem("kda")
    shape = p.shapes[0]
    inputs = p.make_inputs(shape, p.distributions[0], 0, "cuda")
    bases = p.baselines()
    if "fla.chunk_kda" not in bases:  # the question is about FLA; its CPU stand-in would answer another one
        raise SystemExit("gpu_host_load: FLA is not importable here (session e measured torch-chunked-fp32 "
                         f"instead); sys.path: {sys.path}")
    base_name, base = "fla.chunk_kda", bases["fla.chunk_kda"]
    # Triton's @jit reads its function's source from a file: the rendered kernel is imported from one
    src = Path(tempfile.mkdtemp()) / "kda_start.py"
    src.write_text(p.render(p.default_knobs()))
    spec = importlib.util.spec_from_file_location("kda_start", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ns = vars(mod)
    outs = {k: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="cuda")
            for k, s in p.output_specs(shape).items()}
    parties = {base_name: lambda: base(inputs), "start kernel": lambda: ns["run"](inputs, outs)}
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": shape.name,
                 "burners": a.burners, "reps": a.reps, "rows": []}
    for load in ("quiet", "loaded"):
        procs = []
        if load == "loaded":
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.burners)]
            time.sleep(1.0)
        try:
            for name, fn in parties.items():
                for graph in (False, True):
                    try:
                        row = {"load": load, "party": name, "mode": "graph" if graph else "eager",
                               **summary(timings(fn, a.reps, graph))}
                    except Exception as e:  # noqa: BLE001 - a party that cannot be captured says so
                        row = {"load": load, "party": name, "mode": "graph" if graph else "eager",
                               "error": f"{type(e).__name__}: {e}"[:300]}
                    res["rows"].append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for pr in procs:
                pr.kill()
    out = Path(os.environ.get("OUT") or "/tmp")
    (out / "host_load.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
