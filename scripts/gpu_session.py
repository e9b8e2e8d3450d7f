"""The whole stack on a GPU host, measured: a search run per problem, its throughput and the GPU's use.

Starts the dev server, an agent worker and one GPU worker per GPU (`marathon worker --role gpu` with
CUDA_VISIBLE_DEVICES set), starts a search run per problem with `marathon start`, samples every run's
status and every GPU worker's Prometheus counters while they run, stops what is still running at the
deadline (`marathon stop`), writes each run's `marathon report`, and summarises evaluations per hour and
GPU busy fraction per window (a window is a stretch with a fixed number of GPU workers serving).

    python scripts/gpu_session.py --problems kda --gpus 2 --second-gpu-after 150 --minutes 7 --out DIR

`--second-gpu-after S` starts the second GPU worker S seconds after the first one serves, so one run
gives the one-GPU and the two-GPU figure on the same candidates stream.

A search can span several invocations, on the same host or another one, the way a run survives
anything: `--keep-running` does not stop the runs at the deadline; the processes are shut down and the dev
server's SQLite history, the artifact store and the run ids go into DIR/state.tar.gz. A later
`--resume state.tar.gz` restores them, restarts the server and the workers on the same history, and the
same runs go on where they were (interrupted activities are retried by Temporal).

The processes' logs and reports are written under /tmp/marathon-session and archived, with the summary, in
DIR/session.tar.gz; DIR/session.json holds the summary alone, which is also printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the project's packages, for the ledger and the scoreboard
sys.path.insert(0, str(ROOT / "scripts"))  # session_samples and session_results, beside this file
from session_results import (  # noqa: E402
    bench_source_keys, best_source_key, run_records, throughput, verdict_waits)
from session_samples import CPU, SMI, sample_smi, scrape_busy  # noqa: E402
OUT = Path("gpu-session-out")  # --out
WORK = Path("/tmp/marathon-session")
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def marathon(*args, timeout=120, check=False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=check, cwd=ROOT)


def spawn(name: str, args: list[str], env_extra: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, **(env_extra or {}))
    f = open(WORK / f"{name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "cli", *args], stdout=f, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)


def wait_port(port: int, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.3)
    return False


def wait_log(name: str, pattern: str, timeout: float, proc: subprocess.Popen) -> float | None:
    end = time.time() + timeout
    while time.time() < end:
        text = (WORK / f"{name}.log").read_text(errors="replace")
        if re.search(pattern, text):
            return time.time()
        if proc.poll() is not None:
            log(f"{name} exited {proc.returncode}:\n" + text[-3000:])
            return None
        time.sleep(0.5)
    return None


def gpu_worker_env(device: int) -> dict:
    """The environment of the GPU worker of CUDA device `device`: that device alone, and on a host with cores
    to spare two cores of its own to time on (gpu_worker.device.scheduling.timing_cpus)."""
    env = {"CUDA_VISIBLE_DEVICES": str(device)}
    ncpu = os.cpu_count() or 0
    if ncpu >= 16:
        env["MARATHON_TIMING_CPUS"] = f"{ncpu - 2 - 2 * device}-{ncpu - 1 - 2 * device}"
    return env


def iterations_to_raise(st: dict, wanted: int) -> int | None:
    """The iteration budget a resumed run gets, or None to leave it: a resumed run keeps the budget in its
    spec, so --iterations above it is sent as a budget change (otherwise a run resumed at 960 of 1000 with
    --iterations 1200 would end after 40). Never lowered: that is `marathon budget`'s job."""
    have = (st.get("budget") or {}).get("iterations")
    return wanted if have is not None and wanted > have else None


def status(run_id: str) -> dict | None:
    r = marathon("status", run_id, "--json", timeout=60)
    try:
        return json.loads(r.stdout)
    except Exception:  # noqa: BLE001
        return None


def main() -> int:
    global OUT
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", default="kda",
                    help="problems, space-separated; with --split, '|' separates the GPUs' groups, e.g. "
                         "'kda|mla_decode mla_prefill'")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--devices", default="",
                    help="the CUDA devices of GPU workers 0, 1, ..., comma-separated (default 0..gpus-1); worker "
                         "names, metrics ports and --split queues follow the device, so a resumed run queued on "
                         "marathon-gpu-1 is served by `--devices 1` while device 0 does other work")
    ap.add_argument("--queues", default="",
                    help="with --split, the task queues of GPU workers 0, 1, ..., comma-separated (default "
                         "marathon-gpu-D, D the worker's device). A run's queue is in its spec, so this lets a "
                         "machine with one GPU serve a resumed run queued on marathon-gpu-1: `--queues marathon-gpu-1`")
    ap.add_argument("--fresh", default="",
                    help="problems, space-separated, whose resumed run is stopped and replaced by a new one. The "
                         "stop is graceful: the old run's in-flight step still runs on the same GPU beside the new "
                         "run's first minutes")
    ap.add_argument("--second-gpu-after", type=float, default=0.0)
    ap.add_argument("--minutes", type=float, default=6.0, help="search deadline after the first GPU worker serves")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="a wall-clock limit for the whole script, where it runs under one: the search stops "
                         "early enough to leave time for draining, reports and --bench, and the archive is "
                         "written before the limit")
    ap.add_argument("--out", default=str(OUT), help="where session.json, session.tar.gz and state.tar.gz go")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--compact-every", type=int, default=None,
                    help="default: marathon start's (8 x population, at least 10; decisions.default_compact_every)")
    ap.add_argument("--warm", default="", help="MARATHON_WARM_PROBLEM for the GPU workers")
    ap.add_argument("--bench", default="", help="after the runs: `marathon bench` per GPU, e.g. 'kda|mla_decode mla_prefill'"
                    " (GPU 0 measures kda, GPU 1 the two MLA problems), each with the runs' crowned best and "
                    "3 fastest passing kernels")
    ap.add_argument("--bench-timeout", type=float, default=200)
    ap.add_argument("--split", action="store_true",
                    help="one problem group per GPU: group i's runs on task queue marathon-gpu-D (D: worker i's "
                         "device), served by GPU worker i alone, warmed for its group (one group per GPU, both workers from the start)")
    ap.add_argument("--keep-running", action="store_true",
                    help="do not stop the runs at the deadline: save the server's history, the artifacts and the "
                         "run ids to OUT/state.tar.gz for a later --resume")
    ap.add_argument("--resume", default="",
                    help="a state.tar.gz from an earlier --keep-running session: its runs of --problems go on; with "
                         "--keep-running the others wait in the saved state, else they are stopped")
    ap.add_argument("--gpu-tests", action="store_true",
                    help="`pytest -m gpu` on the last GPU: while GPU 1 waits for --second-gpu-after (its worker "
                         "starts once they end), else after the runs")
    a = ap.parse_args()
    groups = [g.split() for g in a.problems.split("|")] if a.split else [a.problems.replace("|", " ").split()]
    problems = [p for g in groups for p in g]
    gpu_of = {p: i for i, g in enumerate(groups) for p in g}
    if a.split and (len(groups) != a.gpus or a.second_gpu_after):
        ap.error("--split needs one problem group per GPU ('|' between groups) and no --second-gpu-after")
    if not problems or len(set(problems)) != len(problems):
        ap.error(f"--problems: each problem once, at least one (got {a.problems!r})")
    try:
        devices = [int(x) for x in a.devices.split(",")] if a.devices else list(range(a.gpus))
    except ValueError:
        ap.error(f"--devices: comma-separated device numbers (got {a.devices!r})")
    if len(devices) != a.gpus or len(set(devices)) != a.gpus or min(devices) < 0:
        ap.error(f"--devices: {a.gpus} distinct device numbers for --gpus {a.gpus} (got {a.devices!r})")
    queues = a.queues.split(",") if a.queues else [f"marathon-gpu-{d}" for d in devices]
    if a.queues and not a.split:
        ap.error("--queues: only with --split (without it every worker serves the default queue)")
    if len(queues) != a.gpus or len(set(queues)) != a.gpus or not all(re.fullmatch(r"[A-Za-z0-9_.-]+", q) for q in queues):
        ap.error(f"--queues: {a.gpus} distinct task queue names (letters, digits, - _ .) for --gpus {a.gpus} "
                 f"(got {a.queues!r})")
    if a.bench and len(a.bench.split("|")) > a.gpus:
        ap.error(f"--bench: at most one group per GPU ({a.gpus}), got {a.bench!r}")
    fresh = set(a.fresh.split())
    if not fresh <= set(problems):
        ap.error(f"--fresh: {sorted(fresh - set(problems))} not in --problems")
    OUT = Path(a.out)
    WORK.mkdir(parents=True, exist_ok=True)
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MARATHON_HOME", str(WORK / "home"))
    os.environ.setdefault("MARATHON_ARTIFACTS", str(WORK / "artifacts"))
    os.environ.setdefault("MARATHON_GPU_WORKDIR", "/dev/shm/marathon-gpu-work")
    summary: dict = {"args": vars(a), "windows": [], "runs": {}, "samples": []}
    procs: list[subprocess.Popen] = []
    resumed = restore_state(Path(a.resume)) if a.resume else forget_runs()
    smi_stop = threading.Event()
    threading.Thread(target=sample_smi, args=(smi_stop,), daemon=True).start()
    if resumed:
        log(f"resumed runs: {resumed}")
    try:
        dev = spawn("dev", ["dev", "--headless", "--db", str(WORK / "temporal.db")])
        procs.append(dev)
        if not wait_port(7233, 60):
            log("dev server did not come up")
            return 1
        procs.append(spawn("agent", ["worker", "--role", "agent"]))
        gpu_env = {"MARATHON_WARM_PROBLEM": a.warm} if a.warm else {}

        def gpu_worker(i: int) -> subprocess.Popen:
            d = devices[i]
            args = ["worker", "--role", "gpu", "--metrics-port", str(9100 + 10 * d)]
            env = dict(gpu_env, **gpu_worker_env(d))
            if a.split:
                args += ["--gpu-queue", queues[i]]
                env["MARATHON_WARM_PROBLEM"] = ",".join(groups[i])
            return spawn(f"gpu{d}", args, env)

        def serving(i: int, since: float) -> None:
            workers.append({"name": f"gpu{devices[i]}", "port": 9101 + 10 * devices[i], "since": since})
            log(f"gpu{devices[i]} serving")

        workers = []  # name, counters port (the Temporal runtime's metrics are on the port below), since
        t_spawn0 = time.time()
        w0 = gpu_worker(0)
        procs.append(w0)
        w1 = None
        early_tests = a.gpu_tests and a.gpus > 1 and a.second_gpu_after > 0
        tests = start_gpu_tests(devices[1]) if early_tests else None
        if a.gpus > 1 and not a.second_gpu_after:
            w1 = gpu_worker(1)
            procs.append(w1)
        t_serve0 = wait_log(f"gpu{devices[0]}", r"polling", 300, w0)
        if t_serve0 is None:
            return 1
        serving(0, t_serve0)
        if w1 is not None:
            t1 = wait_log(f"gpu{devices[1]}", r"polling", 300, w1)
            if t1:
                serving(1, t1)
        ids = {}
        for p in problems:
            if p in resumed and p not in fresh:  # the run goes on from its history: its queue and budget are in its spec
                st = status(resumed[p]) or {}
                if st.get("phase") != "done":
                    ids[p] = resumed[p]
                    more = iterations_to_raise(st, a.iterations)
                    if more:  # --iterations is the session's wish; a resumed run's budget is in its spec
                        r = marathon("budget", resumed[p], "--iterations", str(more))
                        log(f"{p}: iteration budget raised to {more}: rc={r.returncode} {r.stderr.strip()[-300:]}")
                    continue
                log(f"{p}: run {resumed[p]} had ended ({st.get('stopped_by')}); a new one starts")
            rid = f"{p}-{int(T0)}"
            queue = ["--gpu-queue", queues[gpu_of[p]]] if a.split else []
            # the hours budget is wall clock from the start, so a run spread over several invocations gets room
            compact = ["--compact-every", str(a.compact_every)] if a.compact_every else []
            r = marathon("start", p, "--iterations", str(a.iterations), "--population", str(a.population),
                         *compact, "--hours", "8", "--id", rid, *queue)
            log(f"start {p}: rc={r.returncode} {r.stdout.strip()[-200:]} {r.stderr.strip()[-300:]}")
            ids[p] = rid
        waiting = {}  # resumed runs left for a later session: with --keep-running, one not served here waits
        for p, rid in resumed.items():
            if p in fresh or (p not in problems and not a.keep_running):  # it ends here (its history stays)
                log(f"stop resumed {p} ({rid}), replaced (--fresh) or not served:",
                    marathon("stop", rid, "--reason", "not served in this session").returncode)
            elif p not in problems:
                waiting[p] = rid
                log(f"resumed {p} ({rid}) is not served in this session; it waits in the saved state")
        summary["run_ids"] = ids
        summary["waiting_run_ids"] = waiting
        t_start = time.time()
        reserve = 100 + (a.bench_timeout if a.bench else 0) + (90 if a.gpu_tests and not early_tests else 0)
        # the second worker is started as long before its window as the first one took to warm up, so
        # that it joins warm (oracle bank, timing sets, baseline tuned) and the 2-GPU window is not a cold one
        lead = t_serve0 - t_spawn0
        deadline = min(t_serve0 + 60 * a.minutes, time.time() + left(a) - reserve)
        pending_w1 = a.gpus > 1 and a.second_gpu_after > 0
        while time.time() < deadline:
            if pending_w1 and time.time() >= t_serve0 + a.second_gpu_after - lead and (tests is None or tests.poll() is not None):
                pending_w1 = False
                finish_gpu_tests(tests, 1)
                tests = None
                w1 = gpu_worker(1)
                procs.append(w1)
            if w1 is not None and len(workers) == 1:
                text = (WORK / f"gpu{devices[1]}.log").read_text(errors="replace")
                if "polling" in text:
                    serving(1, time.time())
            sample = {"t": time.time(), "busy": {w["name"]: scrape_busy(w["port"]) for w in workers},
                      "timed": {w["name"]: scrape_busy(w["port"], "timed") for w in workers},
                      "closed": {w["name"]: scrape_busy(w["port"], "closed") for w in workers}, "runs": {}}
            done = True
            for p, rid in ids.items():
                st = status(rid)
                if st:
                    sample["runs"][p] = {"iteration": st.get("iteration"), "phase": st.get("phase"),
                                         "best": (st.get("best") or {}).get("speedup")}
                    done &= st.get("phase") == "done"
            summary["samples"].append(sample)
            log("sample", json.dumps({k: v for k, v in sample.items() if k != "t"}))
            if done:
                break
            time.sleep(10)
        for p, rid in ids.items():
            st = status(rid)
            if st and st.get("phase") != "done" and not a.keep_running:
                log(f"stop {p}:", marathon("stop", rid, "--reason", "session deadline").returncode)
        for p, rid in ids.items():
            end = time.time() + (0 if a.keep_running else min(120, max(5, left(a) - 60)))
            while time.time() < end:
                st = status(rid)
                if st and st.get("phase") == "done":
                    break
                time.sleep(3)
            st = status(rid) or {}
            summary["runs"][p] = st
            served_by = [workers[gpu_of[p]]] if a.split and len(workers) == len(groups) else workers
            recs = run_records(st)  # the ledger, read once for the four below
            summary["runs"][p]["throughput"] = throughput(recs, served_by, t_start, summary["samples"], p,
                                                         smi=SMI, cpu=CPU)
            summary["runs"][p]["verdict_waits"] = verdict_waits(recs)
            summary["runs"][p]["best_source_key"] = best_source_key(st, recs)
            summary["runs"][p]["bench_source_keys"] = bench_source_keys(st, recs)
            if left(a) < 30:
                log(f"report {p}: skipped, {left(a):.0f} s of the budget left")
                continue
            r = marathon("report", rid, "--out", str(WORK / f"report-{p}"), timeout=max(10, min(600, left(a) - 20)))
            log(f"report {p}: rc={r.returncode} {r.stdout.strip()[-300:]} {r.stderr.strip()[-300:]}")
        summary["workers"] = workers
        smi_stop.set()
        summary["smi"] = SMI
        summary["cpu"] = CPU
        if a.gpu_tests and not early_tests:
            tests = start_gpu_tests(devices[-1])
        finish_gpu_tests(tests, min(150, left(a) - 20))
        tests = None
        for pr in procs[1:]:  # workers down before the GPUs are measured; the dev server can stay
            pr.terminate()
        for pr in procs[1:]:
            try:  # a worker still letting its activities finish is killed: its runs resume on the next worker
                pr.wait(30)
            except subprocess.TimeoutExpired:
                log(f"process {pr.pid} still running 30 s after its stop: killed")
                pr.kill()
                pr.wait(10)
        if a.bench:
            summary["bench"] = bench(a, summary, devices)
    finally:
        for pr in reversed(procs):
            if pr.poll() is None:
                pr.terminate()
        for pr in procs:
            try:
                pr.wait(20)
            except subprocess.TimeoutExpired:
                pr.kill()
        if a.keep_running and summary.get("run_ids"):
            save_state({**summary.get("waiting_run_ids", {}), **summary["run_ids"]})
        (OUT / "session.json").write_text(json.dumps(summary, indent=1, default=str))
        with tarfile.open(OUT / "session.tar.gz", "w:gz") as tar:
            for f in sorted(WORK.glob("*.log")) + sorted(WORK.glob("report-*")) + sorted(WORK.glob("scoreboard-*")):
                tar.add(f, arcname=f.name)
            tar.add(OUT / "session.json", arcname="session.json")
    print_summary(summary)
    return 0


STATE = ("temporal.db", "home", "artifacts")


def save_state(run_ids: dict) -> None:
    """The server's history, the artifact store and the run ids, for `--resume` (after every process is down,
    so the SQLite file is closed)."""
    (WORK / "runs.json").write_text(json.dumps(run_ids))
    with tarfile.open(OUT / "state.tar.gz", "w:gz") as tar:
        for name in (*STATE, "runs.json"):
            if (WORK / name).exists():
                tar.add(WORK / name, arcname=name)
    log(f"state saved: {(OUT / 'state.tar.gz').stat().st_size / 2**20:.1f} MiB")


def forget_runs() -> dict:
    """A session without --resume starts from an empty history: a run an earlier session on this host left
    unfinished would otherwise go on in the new dev server and share its device. The caches and artifacts
    stay. Returns {} (no resumed runs)."""
    for name in ("temporal.db", "runs.json"):
        (WORK / name).unlink(missing_ok=True)
    return {}


def restore_state(path: Path) -> dict:
    """Unpacks a saved state into the work dir; returns {problem: run id}."""
    if not path.is_file():
        raise SystemExit(f"--resume: {path} is not a file")
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        if not {"temporal.db", "runs.json"} <= names:
            raise SystemExit(f"--resume: {path} holds no temporal.db and runs.json (has {sorted(names)[:8]})")
        for name in STATE:
            if (WORK / name).is_dir():
                shutil.rmtree(WORK / name)
            else:
                (WORK / name).unlink(missing_ok=True)
        tar.extractall(WORK, filter="data")  # 3.11.4 and later
    return json.loads((WORK / "runs.json").read_text())


def left(a) -> float:
    """Seconds left of --budget-s (infinite without one)."""
    return float("inf") if a.budget_s is None else T0 + a.budget_s - time.time()


def best_args(names: list[str], runs: dict) -> list[str]:
    """`--best PROBLEM=KEY` for each of `bench_source_keys` of the runs of the problems `names` measures."""
    return [x for problem in dict.fromkeys(n.partition("@")[0] for n in names)
            for key in runs.get(problem, {}).get("bench_source_keys", []) for x in ("--best", f"{problem}={key}")]


def bench(a, summary: dict, devices: list[int]) -> list:
    """`marathon bench` in one process per GPU, at the same time, each with the runs' `bench_source_keys`."""
    groups = [g.split() for g in a.bench.split("|")]
    procs = []
    for gpu, names in zip(devices, groups):
        out = WORK / f"scoreboard-gpu{gpu}"
        f = open(WORK / f"scoreboard-gpu{gpu}.log", "w")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
        cmd = [sys.executable, "-m", "gpu_worker.scoreboard", *names, "--out", str(out),
               *best_args(names, summary["runs"])]
        log("bench:", " ".join(cmd[1:]))
        procs.append((gpu, out, subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)))
    end = time.time() + min(a.bench_timeout, max(10, left(a) - 40))
    files = []
    for gpu, out, pr in procs:
        try:
            pr.wait(max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            pr.terminate()
            pr.wait(20)
        rows = json.loads((out / "scoreboard.json").read_text()) if (out / "scoreboard.json").exists() else []
        files += [str(out / "scoreboard.json")] if rows else []
        log(f"bench gpu{gpu}: rc={pr.returncode}, {len(rows)} rows")
    from gpu_worker.scoreboard import merge, write

    res = merge(files)
    write(res, OUT)  # the GPUs' rows as one scoreboard.json and .md
    return res


def start_gpu_tests(gpu: int) -> subprocess.Popen:
    """The gpu-marked tests in their own process on one GPU (the one a later worker will join)."""
    f = open(WORK / "pytest-gpu.log", "w")
    log(f"gpu tests on GPU {gpu}")
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu_worker", "tests/baselines",
                             "-p", "no:cacheprovider"], stdout=f, stderr=subprocess.STDOUT,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu)), cwd=ROOT)


def finish_gpu_tests(pr: subprocess.Popen | None, timeout: float) -> None:
    if pr is None:
        return
    try:
        log("gpu tests rc", pr.wait(max(1, timeout)))
    except subprocess.TimeoutExpired:
        pr.terminate()
        pr.wait(20)
        log("gpu tests: timed out")
    log((WORK / "pytest-gpu.log").read_text()[-1500:])


def print_summary(summary: dict) -> None:
    print("==== SUMMARY ====")
    for p, st in summary.get("runs", {}).items():
        b = st.get("best") or {}
        print(f"{p}: iterations {st.get('iteration')}, phase {st.get('phase')}, best {b.get('speedup')}x "
              f"({b.get('time_ms')} ms, {b.get('candidate_id')}), throughput {json.dumps(st.get('throughput'))}")


if __name__ == "__main__":
    import signal

    # `timeout` sends SIGTERM: unwind through main's finally, so the workers stop and the archive is written
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(124)))
    sys.exit(main())
