"""Harness canaries (softmax): a correct slow kernel, a correct faster one, a wrong one and a cheating
one. The self-test evaluates all four through the real compile/verify/benchmark path and checks the
classification (slow and fast pass, wrong fails verification, cheat is rejected with input-mutation);
on CUDA it also checks the ranking (fast's speedup interval lies above slow's) and the timing canaries:
host-side busy work before the launch is not device time (host_busy, in graph mode, and host_busy_eager,
back to back), and eight launches of one kernel's work cost no more than their kernel time (split8). A
failed self-test makes the GPU worker refuse work."""

from __future__ import annotations

import contextvars
import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).parent
CANARIES = ("slow", "fast", "wrong", "cheat")
TIMING_CANARIES = ("host_busy", "host_busy_eager", "split8")


def canary_source(name: str) -> str:
    return (HERE / f"{name}.py").read_text()


def _keyed(ev, name: str) -> tuple[str, str]:
    """A canary's source key in the store and its candidate id."""
    src = canary_source(name)
    return ev.store.put_text(src), "canary-" + hashlib.sha256(src.encode()).hexdigest()[:10]


def _classified(ev, name: str, hb) -> dict:
    """One classification canary through compile and verify, and on CUDA its benchmark where it passed."""
    from workflows.contracts import EvalRequest

    key, cid = _keyed(ev, name)
    req = EvalRequest(problem="softmax", candidate_id=cid, source_key=key)
    comp = ev.compile(req, hb)
    ver = ev.verify(req, hb, prepare_next=False) if comp.ok else None
    r = {"compile_ok": comp.ok, "verify_ok": bool(ver and ver.ok),
         "reason": (ver.reason if ver else comp.error)[:300], "rel_err": ver.rel_err if ver else None}
    if ev.cuda and ver is not None and ver.ok:
        r.update(_bench(ev, key, cid, fresh=(name == "fast"), hb=hb))
    return r


def run_canaries(ev, hb=None) -> dict:
    """Every canary at once, each on a thread of its own (the evaluator schedules their device work as it
    does a population's): on a fresh host the self-test is the first benchmark's wait, and one canary after
    another took minutes there. The timing canaries are measured beside the others and judged against the
    fast canary's figures once all have ended, only where the classification and ranking passed."""
    t0 = time.monotonic()
    problems = []
    timed = TIMING_CANARIES if ev.cuda else ()
    with ThreadPoolExecutor(len(CANARIES) + len(timed), thread_name_prefix="canary") as pool:
        # a context per thread: the activity's heartbeat reaches the server from each of them
        runs = {name: pool.submit(contextvars.copy_context().run, _classified, ev, name, hb) for name in CANARIES}
        runs.update({name: pool.submit(contextvars.copy_context().run, _timing_bench, ev, name, hb)
                     for name in timed})
        results = {name: f.result() for name, f in runs.items()}
    if not (results["slow"]["verify_ok"] and results["fast"]["verify_ok"]):
        problems.append("a correct canary was rejected: slow=%r fast=%r" % (results["slow"]["reason"], results["fast"]["reason"]))
    if results["wrong"]["verify_ok"]:
        problems.append("the wrong canary passed verification")
    elif not results["wrong"]["reason"].startswith(("wrong", "non-finite")):
        problems.append(f"the wrong canary was rejected for another reason: {results['wrong']['reason']}")
    if results["cheat"]["verify_ok"]:
        problems.append("the cheating canary (input mutation) passed verification")
    elif "input-mutation" not in results["cheat"]["reason"]:
        problems.append(f"the cheating canary was rejected for another reason: {results['cheat']['reason']}")
    ranking = "skipped (interpreter: timings are not speed)"
    if ev.cuda and not problems:
        s, f = results["slow"], results["fast"]
        if not (s.get("bench_ok") and f.get("bench_ok")):
            problems.append(f"benchmark failed on a correct canary: {s.get('bench_reason')} / {f.get('bench_reason')}")
        elif not (f["ci"][0] > s["ci"][1]):
            problems.append(f"ranking: fast canary speedup {f['ci']} does not beat slow canary {s['ci']}")
        else:
            ranking = f"fast {f['speedup']:.2f}x (CI {f['ci'][0]:.2f}-{f['ci'][1]:.2f}) > slow {s['speedup']:.2f}x"
    timing = "skipped (interpreter: timings are not speed)"
    if ev.cuda and not problems:
        timing, found = _timing_canaries(results)
        problems += found
    else:
        for name in timed:  # measured, not judged: a canary before them failed
            results.pop(name, None)
    return {"ok": not problems, "problems": problems, "canaries": results, "ranking": ranking, "timing": timing,
            "interpreter": ev.interpreter, "seconds": round(time.monotonic() - t0, 1)}


def _bench(ev, key: str, cid: str, fresh: bool, hb) -> dict:
    from workflows.contracts import BenchRequest

    b = ev.benchmark(BenchRequest(problem="softmax", candidate_id=cid, source_key=key, fresh_process=fresh), hb)
    return {"bench_ok": b.ok, "time_ms": b.time_ms, "speedup": b.speedup, "ci": b.speedup_ci,
            "kernel_ms": b.kernel_ms, "host_ms": b.host_ms, "bench_reason": b.reason,
            "mode": b.receipt.mode if b.receipt else ""}


def _timing_bench(ev, name: str, hb) -> dict:
    key, cid = _keyed(ev, name)
    return _bench(ev, key, cid, fresh=(name == "split8"), hb=hb)


def _timing_canaries(results: dict) -> tuple[str, list[str]]:
    """The device-time judge's own canaries (their benchmarks in `results`), against the fast canary's
    figures."""
    from gpu_worker.timing import canary_host_work, canary_launch_count

    problems, notes = [], []
    fast = results["fast"]
    for name in TIMING_CANARIES:
        r = results[name]
        if not r["bench_ok"]:
            problems.append(f"timing canary {name} was rejected: {r['bench_reason'][:300]}")
            continue
        if name.startswith("host_busy"):
            ok, ratio = canary_host_work(r, fast)
            notes.append(f"{name} ({r['mode']}, host {r['host_ms']:.3g} ms) {ratio:.3f}x the fast canary")
            if not ok:
                problems.append(f"timing canary {name}: {ratio:.3f}x the fast canary ({r['time_ms']:.4g} vs "
                                f"{fast['time_ms']:.4g} ms), outside 0.97-1.03: host work was counted")
        else:
            ok, judged, kernels = canary_launch_count(fast, r, extra_launches=7)
            notes.append(f"split8 judged +{1e3 * judged:.2f} us over fast, kernels +{1e3 * kernels:.2f} us")
            if not ok:
                problems.append(f"timing canary split8: eight launches judged {1e3 * judged:+.2f} us against one, "
                                f"their kernel times differ by {1e3 * kernels:+.2f} us: launch latency was counted")
    return "; ".join(notes), problems
