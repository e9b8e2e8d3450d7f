"""The device's two policies (gpu_worker.device_owner.DeviceOwner, gpu_worker.dispatcher.DeviceDispatcher)
under a stand-in load on the CPU: threads play candidates whose device turns only sleep, with the per-stage
turn lengths of the H200 KDA run in docs/results.md ("Search throughput") scaled by --scale. A comparison of
the policies' mechanics (blocks per drain, time shut to jobs, timing blocks an hour), not a prediction of a
device's rate: host work is a fixed sleep and nothing contends for memory.

    python scripts/device_policy_standin.py --seconds 30
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_worker.device_owner import DeviceOwner  # noqa: E402
from gpu_worker.dispatcher import DeviceDispatcher  # noqa: E402
from gpu_worker.phases import phase  # noqa: E402

# one candidate, seconds on the H200 (docs/results.md): (step, host work before it, device-job turns, each turn)
STAGES = [("compile", 8.5, 1, 0.2), ("verify", 4.5, 11, 0.18), ("benchmark", 2.8, 7, 0.19)]
TIMING_S = 1.23  # a benchmark's timing block(s), together


def candidate(owner, scale: float, stop: threading.Event, done: list, rnd: random.Random) -> None:
    while not stop.is_set():
        for step, host, jobs, turn in STAGES:
            time.sleep(host * scale * rnd.uniform(0.5, 1.5))
            for _ in range(jobs):
                with phase(step), owner.job():
                    time.sleep(turn * scale * rnd.uniform(0.5, 1.5))
        with owner.timing():
            time.sleep(TIMING_S * scale * rnd.uniform(0.8, 1.2))
        done.append(time.monotonic())


def measure(owner, population: int, seconds: float, scale: float, seed: int) -> dict:
    stop, done = threading.Event(), []
    threads = [threading.Thread(target=candidate, args=(owner, scale, stop, done, random.Random(seed + i)),
                                daemon=True) for i in range(population)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    wall = time.monotonic() - t0
    # the counters as they stood at the end (stretches still open then are left out)
    busy, timed, closed, blocks, windows = owner.busy_s, owner.timed_s, owner.closed_s, owner.blocks, owner.windows
    for t in threads:
        t.join(60)
    n = sum(1 for t in done if t - t0 <= wall)
    return {"benchmarks_per_device_hour": round(n / (wall / scale) * 3600), "busy": round(busy / wall, 2),
            "timing": round(timed / wall, 2), "shut_to_jobs": round(closed / wall, 2),
            "blocks_per_drain": round(blocks / max(1, windows), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="wall seconds per policy")
    ap.add_argument("--population", type=int, default=24)
    ap.add_argument("--scale", type=float, default=0.1, help="stand-in seconds per H200 second")
    ap.add_argument("--jobs", type=int, default=4, help="untimed jobs at once (MARATHON_DEVICE_JOBS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2, help="the dispatcher's MARATHON_TIMING_BATCH")
    a = ap.parse_args(argv)
    policies = {"owner": DeviceOwner(max_jobs=a.jobs, window_s=4.0 * a.scale),
                "dispatcher": DeviceDispatcher(max_jobs=a.jobs, batch=a.batch, max_wait_s=1.0 * a.scale,
                                               window_s=4.0 * a.scale)}
    out = {name: measure(p, a.population, a.seconds, a.scale, a.seed) for name, p in policies.items()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
