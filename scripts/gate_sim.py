"""The GPU gate's policy under a synthetic load: the real `TimedLock` (gpu_worker/harness.py), driven by threads
that stand for a GPU worker's in-flight candidates, each holding the gate's sides for as long as session f4's
phase log says an evaluation does (after warm-up). Time is scaled down (`--scale`) so that simulated minutes
take seconds. It compares patience settings; it is a model, not a measurement (docs/throughput.md).

    python scripts/gate_sim.py --patience 0 2 --minutes 20

One evaluation (seconds, unscaled): compile (CPU 9.5 s, then the input upload on the shared side 0.15 s),
verify (shared 0.6 + 1.5 + 0.5, host 0.35, a reference comparison 0.3 with the reference child's lock),
benchmark (shared 0.8 + 0.8, reference prepare 0.4, timing 0.6 on the exclusive side with the reference
child's lock (`--timing`), shared 0.35, host 0.2, reference comparison 0.25), plus `--overhead` seconds per activity
(Temporal's dispatch and the worker's bookkeeping). From session h: `--verify-steps` splits the verification's
runs into that many holds, `--context S --context-share F` makes a share F of compiles first hold the
shared side S seconds for a new child's CUDA context, and the output adds the share of the time the gate
was closed to untimed work."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# (kind, seconds): "cpu" holds nothing; "shared", "ref" (the reference child's lock with the shared side)
# and "timing" (the exclusive side, then the reference child's lock) take the gate
EVALUATION = {
    "compile": [("cpu", 9.5), ("shared", 0.15)],
    "verify": [("shared", 0.6), ("shared", 1.5), ("shared", 0.5), ("cpu", 0.35), ("ref", 0.3)],
    "benchmark": [("shared", 0.8), ("shared", 0.8), ("ref", 0.4), ("timing", 0.6), ("shared", 0.35),
                  ("cpu", 0.2), ("ref", 0.25)],
}


def plan(activity: str, verify_steps: int = 1, context_s: float = 0.0) -> list[tuple[str, float]]:
    """One activity's holds: verification's 1.5 s of runs as `verify_steps` holds (session h's change), and
    a compile that makes a new child's CUDA context first holds the shared side `context_s` for it."""
    steps = list(EVALUATION[activity])
    if activity == "verify" and verify_steps > 1:
        i = steps.index(("shared", 1.5))
        steps[i:i + 1] = [("shared", 1.5 / verify_steps)] * verify_steps
    if activity == "compile" and context_s > 0:
        steps.insert(0, ("shared", context_s))
    return steps


def simulate(patience_s: float, minutes: float, population: int, scale: float, overhead: float,
             timing_s: float = 0.6, verify_steps: int = 1, context_s: float = 0.0,
             context_share: float = 0.0) -> dict:
    import random

    from gpu_worker.harness import TimedLock

    gate = TimedLock(patience_s=patience_s * scale)
    ref = threading.Lock()
    stop = threading.Event()
    done = [0]
    waits = {"shared": [], "timing": []}
    lock = threading.Lock()

    def step(kind: str, secs: float) -> None:
        t = time.monotonic()
        if kind == "cpu":
            time.sleep(secs * scale)
            return
        if kind == "timing":
            with gate:
                waited = time.monotonic() - t
                with ref:
                    time.sleep(secs * scale)
        else:
            with gate.shared(also=ref if kind == "ref" else None):
                waited = time.monotonic() - t
                time.sleep(secs * scale)
        with lock:
            waits["timing" if kind == "timing" else "shared"].append(waited / scale)

    def candidate(rng: random.Random) -> None:
        while not stop.is_set():
            for activity in ("compile", "verify", "benchmark"):
                time.sleep(overhead * scale)
                ctx = context_s if rng.random() < context_share else 0.0
                for kind, secs in plan(activity, verify_steps, ctx):
                    step(kind, timing_s if kind == "timing" else secs)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=candidate, args=(random.Random(i),), daemon=True) for i in range(population)]
    for th in threads:
        th.start()
    warm = 2 * 60 * scale  # the pipeline fills first: count from the third simulated minute
    time.sleep(warm)
    with lock:
        n0, w0 = done[0], {k: len(v) for k, v in waits.items()}
    t0, timed0, closed0 = time.monotonic(), gate.timed_s, gate.closed_s
    time.sleep(minutes * 60 * scale)
    with lock:
        n1 = done[0]
        sw = waits["shared"][w0["shared"]:]
        tw = waits["timing"][w0["timing"]:]
    span = (time.monotonic() - t0) / scale
    stop.set()
    timed = (gate.timed_s - timed0) / scale
    closed = (gate.closed_s - closed0) / scale  # stretches still open at the end are not counted yet
    return {"patience_s": patience_s, "evaluations_per_hour": round((n1 - n0) / span * 3600),
            "timed_fraction": round(timed / span, 3), "closed_fraction": round(closed / span, 3),
            "shared_wait_mean_s": round(sum(sw) / max(1, len(sw)), 2),
            "timing_wait_mean_s": round(sum(tw) / max(1, len(tw)), 2)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patience", type=float, nargs="+", default=[0.0, 2.0])
    ap.add_argument("--minutes", type=float, default=20.0, help="simulated minutes counted per setting")
    ap.add_argument("--population", type=int, default=24)
    ap.add_argument("--scale", type=float, default=0.05, help="real seconds per simulated second")
    ap.add_argument("--overhead", type=float, default=0.5)
    ap.add_argument("--timing", type=float, default=0.6,
                    help="seconds of a benchmark's timing on the exclusive side (0.25: the early stop's case)")
    ap.add_argument("--verify-steps", type=int, default=1,
                    help="holds a verification's runs take (8: one per step, as from session h)")
    ap.add_argument("--context", type=float, default=0.0,
                    help="seconds a new child's CUDA context holds the shared side (1.9-8.7 in session h)")
    ap.add_argument("--context-share", type=float, default=0.0,
                    help="share of compiles that make a context (about 0.5 in session h)")
    a = ap.parse_args(argv)
    if not 0 < a.scale <= 1 or a.minutes <= 0 or a.population < 1 or a.timing <= 0 or a.verify_steps < 1 \
            or a.context < 0 or not 0 <= a.context_share <= 1:
        ap.error("--scale in (0, 1], --minutes > 0, --population >= 1, --timing > 0, --verify-steps >= 1, "
                 "--context >= 0, --context-share in [0, 1]")
    for p in a.patience:
        print(simulate(p, a.minutes, a.population, a.scale, a.overhead, a.timing, a.verify_steps, a.context,
                       a.context_share), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
