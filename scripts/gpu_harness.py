"""The evaluation harness's (gpu_worker) figures on one GPU: canaries, ceilings, honest kernels with
receipts and profiler cross-checks, a best measured head-to-head, a profile, and a throughput run. The
cheating families are the gpu-marked cheat tests' (`pytest -m gpu tests/gpu_worker`), which assert them.

    python scripts/gpu_harness.py [--throughput-s 120] [--problem kda] [--skip throughput,...]

Full results go to $OUT/harness.json and $OUT/harness.log (OUT defaults to /tmp/gpu-harness-out); a short
table is printed last.
Sections are skipped, and say so, when the wall-clock budget (--budget-s) runs short.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OUT = Path(os.environ.get("OUT") or "/tmp/gpu-harness-out")
OUT.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("MARATHON_ARTIFACTS", str(OUT / "artifacts"))
os.environ.setdefault("MARATHON_GPU_WORKDIR", "/tmp/marathon-gpu-work")

from workflows.artifacts import ArtifactStore  # noqa: E402
from gpu_worker.canaries import canary_source  # noqa: E402
from gpu_worker.harness import Evaluator  # noqa: E402
from gpu_worker.device.scheduling import Scheduler  # noqa: E402
from gpu_worker.settings import GpuWorkerSettings  # noqa: E402
from workflows.contracts import BenchRequest, BestRef, EvalRequest  # noqa: E402

T0 = time.monotonic()
RESULTS: dict = {"sections": {}}
TABLE: list[str] = []


def log(*a):
    line = " ".join(str(x) for x in a)
    print(line, flush=True)
    with open(OUT / "harness.log", "a") as f:
        f.write(line + "\n")


def save():
    (OUT / "harness.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def req(store, source, problem="softmax", shape=None):
    return EvalRequest(problem=problem, candidate_id=hashlib.sha256(source.encode()).hexdigest()[:16],
                       source_key=store.put_text(source), shape=shape)


def section(name, budget, args):
    def deco(fn):
        left = args.budget_s - (time.monotonic() - T0)
        if left < budget:
            log(f"== {name}: SKIPPED ({left:.0f} s left, needs ~{budget} s)")
            RESULTS["sections"][name] = "skipped"
            return fn
        log(f"== {name} (t={time.monotonic() - T0:.0f} s)")
        t = time.monotonic()
        try:
            RESULTS["sections"][name] = fn()
        except Exception:  # noqa: BLE001
            RESULTS["sections"][name] = {"error": traceback.format_exc()}
            log(traceback.format_exc())
        log(f"   {name} took {time.monotonic() - t:.1f} s")
        save()
        return fn
    return deco


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--throughput-s", type=float, default=120)
    ap.add_argument("--problem", default="kda")
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    store = ArtifactStore()
    settings = GpuWorkerSettings.from_env(os.environ)
    ev = Evaluator(store=store, settings=settings, scheduler=Scheduler.under(settings, spares=3))
    RESULTS["interpreter"] = ev.interpreter
    log("interpreter:", ev.interpreter)

    if "selftest" not in skip:
        @section("selftest", 60, args)
        def _():
            r = ev.selftest()
            log(json.dumps(r, indent=1, default=str))
            c = r["canaries"]
            TABLE.append(f"selftest ok={r['ok']} ranking: {r['ranking']}; timing canaries: {r['timing']}")
            for n in ("slow", "fast", "wrong", "cheat"):
                TABLE.append(f"  canary {n:5s} verify_ok={c[n]['verify_ok']} speedup={c[n].get('speedup')} "
                             f"ci={c[n].get('ci')} reason={c[n]['reason'][:60]!r}")
            return r

    if "ceilings" not in skip and ev.cuda:
        @section("ceilings", 10, args)
        def _():
            from baselines.registry import get_problem

            p = get_problem("softmax")
            c = ev.ensure_ceilings(p, p.shapes[0], None)
            TABLE.append(f"ceilings: copy {c.bandwidth / 1e12:.2f} TB/s, bf16 matmul {c.flops / 1e12:.0f} TFLOP/s")
            return c

    if "honest" not in skip:
        @section("honest", 60, args)
        def _():
            from baselines.registry import get_problem

            out = {}
            for prob in ("softmax", args.problem):
                p = get_problem(prob)
                r = req(store, p.template(), prob)
                c = ev.compile(r)
                v = ev.verify(r) if c.ok else None
                b = ev.benchmark(BenchRequest(problem=prob, candidate_id=r.candidate_id, source_key=r.source_key,
                                              fresh_process=True)) if v and v.ok else None
                out[prob] = {"compile": c.model_dump(), "verify": v.model_dump() if v else None,
                             "bench": b.model_dump() if b else None,
                             "bench_log": store.get_text(b.log_key)[-3000:] if b and b.log_key else None}
                log(json.dumps(out[prob], indent=1, default=str))
                TABLE.append(f"{prob} template: compile ok={c.ok} regs={c.registers} spills={c.spills} "
                             f"smem={c.shared_bytes} tc={c.tensor_cores} tma={c.tma} ({c.seconds:.1f}s) {c.error[:80]}")
                if v:
                    TABLE.append(f"  verify ok={v.ok} rel_err={v.rel_err} base={v.baseline_rel_err} thr={v.threshold} "
                                 f"{v.reason[:80]} ({v.seconds:.1f}s)")
                if b:
                    TABLE.append(f"  bench ok={b.ok} {b.time_ms} ms vs {b.baseline_name} {b.baseline_ms} ms "
                                 f"speedup {b.speedup} CI {b.speedup_ci} {b.reason[:80]}")
                    if b.receipt:
                        TABLE.append(f"  receipt: {b.receipt.model_dump()}")
            return out

    if "best" not in skip:
        @section("best", 30, args)
        def _():
            slow = canary_source("slow")
            best = BestRef(candidate_id="slow", source_key=store.put_text(slow), speedup=1.0, time_ms=1.0,
                           baseline_ms=1.0, iteration=0)
            r = req(store, canary_source("fast"))
            b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=r.candidate_id, source_key=r.source_key,
                                          best=best))
            TABLE.append(f"interleaved fast vs baseline vs best(slow): cand {b.time_ms} base {b.baseline_ms} "
                         f"best {b.best_time_ms} ms, CI {b.speedup_ci}")
            return b.model_dump()

    if "profile" not in skip:
        @section("profile", 40, args)
        def _():
            r = req(store, canary_source("fast"))
            pr = ev.profile(r)
            log(pr.summary)
            TABLE.append(f"profile tool={pr.tool} bound={pr.bound}: {pr.summary[:200]!r}")
            return pr.model_dump()

    if "throughput" not in skip:
        @section("throughput", args.throughput_s + 20, args)
        def _():
            return throughput(ev, store, args.problem, args.throughput_s)

    ev.close()
    RESULTS["total_s"] = time.monotonic() - T0
    save()
    print("\n==== SUMMARY ====")
    for line in TABLE:
        print(line)


def throughput(ev, store, problem_name, seconds):
    """Evaluate distinct candidates (knob settings of the problem's template) through compile -> verify ->
    benchmark with the worker's concurrency (compiles overlap GPU work; the device owner schedules the rest)."""
    from baselines.registry import get_problem

    p = get_problem(problem_name)
    if os.environ.get("MARATHON_WARM", "1") == "1":
        w = ev.warm(problem_name)  # oracle bank + ceilings, as a worker does at start (MARATHON_WARM_PROBLEM)
        log("warm:", w)
    space = p.knob_space()
    rng = random.Random(0)
    seen, sources = set(), []
    for _ in range(2000):
        knobs = {k: rng.choice(v) for k, v in space.items()}
        key = json.dumps(knobs, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        try:
            sources.append(p.render(knobs))
        except Exception:  # noqa: BLE001
            continue
    busy0 = ev.owner.busy_s
    t0 = time.monotonic()
    done, outcomes = [], {}
    stop = t0 + seconds

    def one(src):
        if time.monotonic() > stop:
            return None
        r = req(store, src, problem_name)
        ts = time.monotonic()
        c = ev.compile(r)
        if not c.ok:
            return ("compile", time.monotonic() - ts, c.error[:100])
        v = ev.verify(r)
        if not v.ok:
            return ("verify:" + v.stage, time.monotonic() - ts, v.reason[:100])
        b = ev.benchmark(BenchRequest(problem=problem_name, candidate_id=r.candidate_id, source_key=r.source_key))
        return ("ok" if b.ok else "bench", time.monotonic() - ts, b.speedup if b.ok else b.reason[:100])

    with ThreadPoolExecutor(max_workers=4) as pool:
        for res in pool.map(one, sources):
            if res is None:
                continue
            done.append(res)
            outcomes[res[0]] = outcomes.get(res[0], 0) + 1
    wall = time.monotonic() - t0
    busy = ev.owner.busy_s - busy0
    rate = len(done) / wall * 3600
    TABLE.append(f"throughput {problem_name}: {len(done)} evaluations in {wall:.0f} s = {rate:.0f}/h; GPU busy "
                 f"{busy:.0f} s = {100 * busy / wall:.0f}% of wall; outcomes {outcomes}")
    return {"evaluations": len(done), "wall_s": wall, "per_hour": rate, "gpu_busy_s": busy,
            "gpu_busy_fraction": busy / wall, "outcomes": outcomes, "samples": done[:40]}


if __name__ == "__main__":
    main()
