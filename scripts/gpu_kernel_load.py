"""Why does a fresh candidate child spend seconds loading kernels that an earlier child compiled?

The phase log of the 2026-11-30 H200 runs (docs/throughput.md) shows `prepare.kernels` at 6-7 s per
child for the KDA template: about what compiling costs, although Triton's on-disk cache should already
hold the kernels. This script runs the candidate child's `compile` step (Triton's warmup path, the
same code the harness uses) in N fresh processes one after the other, each with its own temp dir as
TRITON_HOME and one shared TRITON_CACHE_DIR, like the sandbox does, and prints per process the seconds
and the top functions under cProfile. If the cache works, process 2..N take a fraction of process 1.

    python scripts/gpu_kernel_load.py [--problem kda] [--runs 3] [--same-path]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(problem: str, source_path: str, tmp: str) -> None:
    sys.path.insert(0, str(ROOT))
    from gpu_worker.child import Server

    t0 = time.perf_counter()
    server = Server(tmp, "candidate")
    t_server = time.perf_counter() - t0
    source = Path(source_path).read_text()
    t0 = time.perf_counter()
    server.cmd_load(source, problem, None, [], [os.environ["TRITON_CACHE_DIR"]])
    t_load = time.perf_counter() - t0
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    r = server.cmd_compile(server.problem.distributions[0])
    prof.disable()
    t_compile = time.perf_counter() - t0
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
    print(json.dumps({"server_s": round(t_server, 3), "load_s": round(t_load, 3), "compile_s": round(t_compile, 3),
                      "timing": r.get("timing"), "kernels": [k.get("name") for k in r.get("kernels", [])]}))
    print(out.getvalue()[:6000])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default="kda")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--same-path", action="store_true", help="every process loads the candidate from one path")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return 0
    sys.path.insert(0, str(ROOT))
    from baselines.registry import get_problem

    import torch

    cuda = torch.cuda.is_available()
    work = Path(tempfile.mkdtemp(prefix="kernel-load-"))
    cache = work / "triton-cache"
    cache.mkdir()
    src = get_problem(a.problem).template()
    shared = work / "candidate.py"
    shared.write_text(src)
    for i in range(a.runs):
        tmp = work / f"child{i}"
        tmp.mkdir()
        path = shared if a.same_path else tmp / "candidate.py"
        path.write_text(src)
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache), TRITON_HOME=str(tmp), TMPDIR=str(tmp),
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("TRITON_INTERPRET", None)
        if not cuda:  # a smoke test of this script without a GPU: the interpreter, nothing to cache
            env["TRITON_INTERPRET"] = "1"
        t0 = time.time()
        r = subprocess.run([sys.executable, __file__, "--child", a.problem, str(path), str(tmp)], env=env,
                           capture_output=True, text=True, cwd=tmp)
        print(f"=== process {i + 1}: {time.time() - t0:.1f} s wall, rc {r.returncode}")
        print(r.stdout[-7000:])
        if r.returncode:
            print(r.stderr[-3000:])
    print("cache files:", sum(1 for _ in cache.rglob("*")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
