"""Does another process creating its CUDA context disturb a timing on the same GPU?

Session h (docs/throughput.md, finding 8) found the GPU gate closed to untimed work 62-70% of the time,
mostly while timing requests waited for shared holds to drain, and the longest shared holds were new
candidate children creating their CUDA contexts: 1.9-8.7 s each, in about half of all compiles. The
harness makes contexts under the gate's shared side on the assumption that context creation is device
work that could slow a kernel being timed. This script measures that assumption on the device.

It times KDA at its primary shape the way a candidate child does (an L2 flush, then events around one
call, a device-wide synchronize after each repetition), in blocks that alternate between quiet (nothing
else on the device) and noisy (`--spawners` threads each starting fresh Python processes that import torch
and create a CUDA context, one after another). Every context creation's wall-clock interval is recorded,
so the noisy blocks' repetitions are also split into those that overlapped a creation and those that did
not. Printed and written as JSON (`--out`): per kernel and comparison, medians, 90th percentiles, and the
bootstrap 95% interval of median(without) / median(with) (wholly below 1: the noise slows the kernel),
plus the creations' own durations.

    python scripts/gpu_context_noise.py [--blocks 6] [--reps 40] [--spawners 3] [--out noise.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# a fresh process's CUDA context, timed from after its imports: the part a spare child does under the gate
CREATE = ("import time, torch; t = time.time(); torch.empty(1, device='cuda'); torch.cuda.synchronize(); "
          "print(t, time.time())")


def spawner(stop: threading.Event, intervals: list, lock: threading.Lock) -> None:
    while not stop.is_set():
        p = subprocess.run([sys.executable, "-c", CREATE], capture_output=True, text=True, timeout=300)
        try:
            t0, t1 = (float(x) for x in p.stdout.split())
        except ValueError:
            continue
        with lock:
            intervals.append((t0, t1))


def overlaps(rep: tuple[float, float], intervals: list) -> bool:
    return any(a < rep[1] and rep[0] < b for a, b in intervals)


def summary(without: list[float], with_: list[float]) -> dict:
    """Times (ms) without and with the noise: counts, medians, 90th percentiles, and the bootstrap 95%
    interval of median(without) / median(with) (wholly below 1: the noise slows the kernel)."""
    from gpu_worker.harness import bootstrap_ratio_ci, median, quantile

    out = {"without_n": len(without), "with_n": len(with_)}
    if without and with_:
        out.update(without_median_ms=median(without), with_median_ms=median(with_),
                   without_p90_ms=quantile(without, .9), with_p90_ms=quantile(with_, .9),
                   without_over_with_ci=bootstrap_ratio_ci(without, with_))
    return out


def kernels() -> dict:
    """name -> (fn(inputs, out), inputs, out): our starting kernel and, where importable, FLA's."""
    import importlib.util
    import tempfile

    import torch

    from baselines.kda.spec import PROBLEM as P

    shape = P.shapes[0]
    x = P.make_inputs(shape, P.distributions[0], seed=1000, device="cuda")
    out = {n: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device="cuda")
           for n, s in P.output_specs(shape).items()}
    path = Path(tempfile.mkdtemp()) / "kda_start.py"
    path.write_text(P.render(P.default_knobs()))
    spec = importlib.util.spec_from_file_location("kda_start", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    found = {"kda starting kernel": (mod.run, x, out)}
    base = P.baselines()
    if "fla.chunk_kda" in base:
        found["fla.chunk_kda"] = (lambda inp, _out, f=base["fla.chunk_kda"]: f(inp), x, out)
    return found


def time_block(fn, x, out, reps: int, flush) -> list[tuple[float, float, float]]:
    """(wall start, wall end, event ms) per repetition, as child.cmd_time times one."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    for _ in range(reps):
        flush.zero_()
        torch.cuda.synchronize()
        w0 = time.time()
        start.record()
        fn(x, out)
        end.record()
        torch.cuda.synchronize()
        rows.append((w0, time.time(), start.elapsed_time(end)))
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=6, help="quiet and noisy blocks each")
    ap.add_argument("--reps", type=int, default=40, help="repetitions per block and kernel")
    ap.add_argument("--spawners", type=int, default=3, help="threads starting context-creating processes")
    ap.add_argument("--out", default="", help="write the result as JSON here")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    ks = kernels()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    flush = torch.empty(max(2 * l2, 256 << 20) // 4, dtype=torch.int32, device="cuda")
    for fn, x, out in ks.values():  # compiled, autotuned and warm before anything is timed
        for _ in range(3):
            fn(x, out)
    torch.cuda.synchronize()
    rows = {name: {"quiet": [], "noisy": []} for name in ks}
    intervals: list = []
    lock = threading.Lock()
    for b in range(a.blocks):
        for mode in ("quiet", "noisy"):
            stop = threading.Event()
            threads = []
            if mode == "noisy":
                threads = [threading.Thread(target=spawner, args=(stop, intervals, lock), daemon=True)
                           for _ in range(a.spawners)]
                for t in threads:
                    t.start()
                time.sleep(4.0)  # the spawned processes' imports first: their contexts come after
            for name, (fn, x, out) in ks.items():
                rows[name][mode] += time_block(fn, x, out, a.reps, flush)
            stop.set()
            for t in threads:
                t.join(300)
    with lock:
        spans = list(intervals)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "args": vars(a), "context_creations": len(spans),
              "context_seconds": sorted(round(b - s, 3) for s, b in spans), "kernels": {}}
    for name, r in rows.items():
        quiet = [ms for _, _, ms in r["quiet"]]
        noisy = [ms for _, _, ms in r["noisy"]]
        hit = [ms for w0, w1, ms in r["noisy"] if overlaps((w0, w1), spans)]
        miss = [ms for w0, w1, ms in r["noisy"] if not overlaps((w0, w1), spans)]
        # "blocks": quiet blocks against noisy ones; "overlap": within noisy blocks, the repetitions that
        # overlapped no creation against those that overlapped one
        result["kernels"][name] = {"blocks": summary(quiet, noisy), "overlap": summary(miss, hit)}
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
