"""What an LLM-policy run waits for each verdict: the model's turn rate is bounded by it.

Starts a scripted OpenAI-compatible endpoint in this process (tests/llm/server.py: the replies are fixed, so
the time measured is the system's, not a model's), the dev server, then at once an agent worker, one GPU
worker and one `marathon start PROBLEM --policy llm` run, the way scripts/gpu_session.py does. The scripted
model submits, one per turn: the starting kernel as written, the same with a name Triton cannot resolve in
its kernels (rejected when compiled), with a Python syntax error (rejected by the static rules, before the
GPU), and knob variants of it (one knob moved to its neighbouring value each, default the last three knobs
of the problem's KNOB_SPACE).

Per submission: the latency from the moment the endpoint wrote the reply that submitted it to the arrival of
the next turn's request, which carries the verdict (the endpoint sees both), split into the evaluation
(the EvaluateCandidate child workflow, with the GPU worker's compile / verify / benchmark seconds from its
activity log), the profile a timed kernel's answer brings on a GPU (profile_candidate, from the run's
history) and the rest (the turn's own handling, the workflow, the queues). Cold start: from starting the
workers and the run to the first verdict. Targets: a verdict in <= 30 s, the first <= 3 min after a cold
start.

    python scripts/llm_latency.py [--problem kda] [--budget-s 330] --out DIR

writes DIR/latency.json (with each stage's phases), DIR/latency.md (printed last) and the processes' logs
under DIR/logs. Everything is bounded by --budget-s: submissions without a verdict by then are reported as
such. Without CUDA the GPU worker runs the Triton interpreter (softmax by default): the figures then say
how the pieces fit, not how fast a GPU answers.

The scripted endpoint is the tests' own (tests/llm): a test double, which the product's packages do not
ship; a measurement that drives the product from outside imports it from there.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/: gpu_session's helpers
import gpu_session as gs  # noqa: E402  (puts the project's root on sys.path)

from baselines.registry import get_problem  # noqa: E402
from tests.llm.script import TurnScript, prompt_tokens  # noqa: E402
from tests.llm.server import ChatServer, completion  # noqa: E402

TARGET_VERDICT_S = 30.0  # a candidate slower than the best, or refused when compiled
TARGET_BEST_S = 90.0  # a new best, with its extra checks
TARGET_RULES_S = 2.0  # refused by the parser or the static rules
TARGET_FIRST_S = 180.0
STAGES = ("compile", "verify", "benchmark")
RESERVE_S = 30.0  # of --budget-s, kept for reading the history, stopping the processes and writing the results
WALL = time.time() - time.monotonic()  # monotonic -> epoch seconds (the endpoint's times are monotonic)


# ---- what the scripted model submits ---------------------------------------------------------------------
def compile_error(source: str) -> str:
    """`source` with a range whose length is not a power of two made in every @triton.jit function: valid
    Python the static rules pass, refused when Triton compiles the kernels (under the interpreter, at the
    first run, which is where the compile stage surfaces an interpreted kernel's errors)."""
    lines = source.splitlines(keepends=True)
    at = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            body = node.body
            doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1
            first = body[1] if doc else body[0]
            at.append((first.lineno - 1, first.col_offset))
    if not at:
        raise ValueError("no @triton.jit function in the starting kernel")
    for i, col in sorted(at, reverse=True):
        lines.insert(i, " " * col + "_not_a_power_of_two = tl.arange(0, 3)\n")
    return "".join(lines)


def syntax_error(source: str) -> str:
    return source.rstrip("\n") + "\n\nif True\n    pass\n"  # the colon missing


def neighbour_variants(problem: str, n: int = 3) -> list[dict]:
    """One knob each moved to the next value of its KNOB_SPACE list (the previous one at the list's end),
    for the last `n` knobs of the space: launch settings in the project's problems, each a fresh compile."""
    p = get_problem(problem)
    base, space = p.default_knobs(), p.knob_space()
    out = []
    for k in list(space)[-n:]:
        vals = space[k]
        i = vals.index(base[k])
        out.append({k: vals[i + 1] if i + 1 < len(vals) else vals[i - 1]})
    return out


def parse_variant(text: str) -> dict:
    """'num_warps=8,num_stages=2' -> {'num_warps': 8, 'num_stages': 2} (values as Python literals, else
    strings)."""
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        try:
            out[k.strip()] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            out[k.strip()] = v.strip()
    return out


def submissions(problem: str, variants: list[dict]) -> list[dict]:
    """What the scripted model submits, in order: the failures early, so that a tight budget loses knob
    variants, not the rejection paths."""
    p = get_problem(problem)
    start = p.template()
    base = p.default_knobs()
    subs = [{"label": "starting kernel as written", "kind": "start", "source": start},
            {"label": "compile error (a range of 3 in the kernels)", "kind": "compile-error",
             "source": compile_error(start)},
            {"label": "Python syntax error", "kind": "syntax-error", "source": syntax_error(start)}]
    for v in variants:
        label = ", ".join(f"{k} {base.get(k)!r} -> {x!r}" for k, x in v.items())
        subs.append({"label": label, "kind": "variant", "source": p.render(v)})
    return subs


def script(subs: list[dict]) -> TurnScript:
    """One submit_kernel call per turn; the call ids name the submission, so its verdict is found in the next
    request. Past the script the model has nothing to do, and the run ends after its idle turns."""
    def item(i: int, s: dict):
        return lambda body: completion(None, [("submit_kernel", {"source": s["source"], "rationale": s["label"]})],
                                       prompt_tokens=prompt_tokens(body), completion_tokens=len(s["source"]) // 4,
                                       call_ids=[f"submit_{i}"])

    return TurnScript([item(i, s) for i, s in enumerate(subs)])


# ---- what was seen -------------------------------------------------------------------------------------
VERDICT = re.compile(r"^iteration (\d+): (improved|passed|rejected)(?: at (\w+))?")


def verdicts(turns: list, n: int) -> list[dict]:
    """Per submission i (turn i served it): when the reply went out, when the request carrying its answer
    (turn i + 1, the tool message of call submit_i) arrived, and the answer."""
    out = []
    for i in range(n):
        row: dict = {"served": turns[i].served if i < len(turns) else None, "answered": None, "answer": None}
        if i + 1 < len(turns):
            for m in turns[i + 1].body.get("messages", []):
                if m.get("role") == "tool" and m.get("tool_call_id") == f"submit_{i}":
                    row["answered"], row["answer"] = turns[i + 1].at, str(m.get("content") or "")
        m = VERDICT.match(row["answer"] or "")
        row.update(iteration=int(m.group(1)) if m else None, outcome=m.group(2) if m else None,
                   stage=m.group(3) if m else None)
        if row["served"] is not None and row["answered"] is not None:
            row["latency_s"] = round(row["answered"] - row["served"], 3)
        out.append(row)
    return out


def gpu_stages(log_path: Path, run_id: str) -> dict[int, dict]:
    """Per iteration of the run: seconds of each GPU stage (compile, verify, benchmark: summed where a stage
    ran more than once, e.g. a would-be best re-measured) and their phases, from the GPU worker's log."""
    out: dict[int, dict] = {}
    if not log_path.exists():
        return out
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if d.get("event") not in STAGES or not str(d.get("workflow_id", "")).startswith(run_id) \
                or not isinstance(d.get("iteration"), int):
            continue
        it = out.setdefault(d["iteration"], {"seconds": {}, "phases": {}, "ok": {}})
        st = d["event"]
        it["seconds"][st] = round(it["seconds"].get(st, 0.0) + (d.get("seconds") or 0.0), 3)
        it["ok"][st] = d.get("ok")
        for k, v in (d.get("phases") or {}).items():
            it["phases"].setdefault(st, {})
            it["phases"][st][k] = round(it["phases"][st].get(k, 0.0) + v, 3)
    return out


async def _history_marks(address: str, run_id: str) -> list[tuple[str, float, float]]:
    from temporalio.api.enums.v1 import EventType as E

    from workflows.client import connect
    from workflows.evaluation import RESULT_SIGNAL

    client = await connect(address, None)
    hist = await client.get_workflow_handle(run_id).fetch_history()
    scheduled: dict[int, tuple[str, float]] = {}
    out = []
    for e in hist.events:
        t = e.event_time.ToMicroseconds() / 1e6
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = (e.activity_task_scheduled_event_attributes.activity_type.name, t)
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name, t0 = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id, ("?", t))
            out.append((name, t0, t))
        elif e.event_type == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            out.append(("evaluation-start", t, t))
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED \
                and e.workflow_execution_signaled_event_attributes.signal_name == RESULT_SIGNAL:
            out.append(("evaluation-result", t, t))
    return out


def history_marks(address: str, run_id: str) -> list[tuple[str, float, float]]:
    """From the run's history (its current execution: a run this short does not continue-as-new), in epoch
    seconds: (activity type, scheduled, completed) of its completed activities, and (name, t, t) marks for
    each evaluation's start (`evaluation-start`: a child workflow, abandoned by design) and each result it
    signals back (`evaluation-result`). [] where the server does not answer."""
    try:
        return asyncio.run(asyncio.wait_for(_history_marks(address, run_id), 30))
    except Exception as e:  # noqa: BLE001 - the split is an extra: the latencies stand without it
        gs.log(f"history not read: {type(e).__name__}: {e}")
        return []


def split(row: dict, marks: list, stages: dict[int, dict], iteration: int) -> None:
    """The row's latency split: its evaluation (the child workflow's start to its last result signal) and
    profile from the run's history within the row's window, the GPU stages of its iteration (submission i
    is iteration i: each one is recorded, a rejection too, so a stage without a verdict yet shows), and
    the rest."""
    stage = stages.get(iteration, {})
    row["gpu_seconds"] = stage.get("seconds", {})
    row["gpu_phases"] = stage.get("phases", {})
    if row.get("latency_s") is None or not marks:
        return
    lo, hi = row["served"] + WALL, row["answered"] + WALL
    inside = [(n, a, b) for n, a, b in marks if lo <= a and b <= hi]
    starts = [a for n, a, _ in inside if n == "evaluation-start"]
    results = [a for n, a, _ in inside if n == "evaluation-result"]
    row["evaluation_s"] = round(max(results) - min(starts), 3) if starts and results else None
    row["profile_s"] = round(sum(b - a for n, a, b in inside if n == "profile_candidate"), 3)
    row["rest_s"] = round(row["latency_s"] - (row["evaluation_s"] or 0) - row["profile_s"], 3)


# ---- the report ---------------------------------------------------------------------------------------
def _f(x, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(res: dict) -> str:
    c = res["cold_start"]
    rows = res["submissions"]
    lat = [r["latency_s"] for r in rows if r.get("latency_s") is not None]
    warm = [r["latency_s"] for r in rows[1:] if r.get("latency_s") is not None]

    def met(x, target):
        return "-" if x is None else ("met" if x <= target else "missed")

    def target(i: int, r: dict) -> float:
        if i == 1:
            return TARGET_FIRST_S
        if r.get("outcome") == "improved":
            return TARGET_BEST_S
        return TARGET_RULES_S if r.get("stage") == "rules" else TARGET_VERDICT_S

    targets = [target(i, r) for i, r in enumerate(rows, 1)]
    judged = list(zip(targets[1:], (r.get("latency_s") for r in rows[1:])))
    host = ("a host that has served before: its GPU work directory kept" if res.get("gpu_workdir_kept")
            else "the GPU work directory emptied")

    first = c.get("first_verdict_s")
    lines = [f"# Verdict latency: {res['problem']}, policy llm, {res['device']}", "",
             f"Cold start ({host}): the workers and the run started, the first verdict {_f(first)} s later "
             f"(target <= {TARGET_FIRST_S:.0f} s: {met(first, TARGET_FIRST_S)}); the GPU worker polled at "
             f"{_f(c.get('gpu_worker_polling_s'))} s, the first model turn arrived at {_f(c.get('first_turn_s'))} s.",
             f"Verdicts after the first: median {_f(sorted(warm)[len(warm) // 2] if warm else None)} s, slowest "
             f"{_f(max(warm) if warm else None)} s; against their targets (<= {TARGET_VERDICT_S:.0f} s slower "
             f"than the best, <= {TARGET_BEST_S:.0f} s a new best, <= {TARGET_RULES_S:.0f} s refused by the rules) "
             f"{sum(1 for t, x in judged if x is not None and x <= t)} of {len(judged)} met; {len(lat)} of "
             f"{len(rows)} submissions answered within the budget.", "",
             "Latency: from the endpoint writing the submitting reply to the next turn's request carrying the "
             "verdict. Evaluation: the EvaluateCandidate child workflow, of which compile / verify / benchmark "
             "are the GPU worker's activities; profile: the profile a timed kernel's answer brings; rest: the "
             "turn's handling, the workflow and the queues.", "",
             "| # | submission | verdict | latency s | target s | evaluation s | compile s | verify s | "
             "benchmark s | profile s | rest s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        verdict = "no verdict by the end" if r.get("answered") is None else \
            (f"{r['outcome']}" + (f" at {r['stage']}" if r.get("stage") else "") if r.get("outcome")
             else (r.get("answer") or "")[:60])
        g = r.get("gpu_seconds") or {}
        t = targets[i - 1]
        lines.append(f"| {i} | {r['label']} | {verdict} | {_f(r.get('latency_s'))} | {t:.0f}: "
                     f"{met(r.get('latency_s'), t)} | {_f(r.get('evaluation_s'))} | "
                     + " | ".join(_f(g.get(s)) for s in STAGES)
                     + f" | {_f(r.get('profile_s'))} | {_f(r.get('rest_s'))} |")
    return "\n".join(lines) + "\n"


def device_name(device: int) -> str | None:
    """The GPU the worker will use, by nvidia-smi's name for it; None without CUDA (the worker then runs the
    Triton interpreter). torch only answers whether CUDA is there: no context of this process on the GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        r = subprocess.run(["nvidia-smi", "-i", str(device), "--query-gpu=name,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if r.returncode != 0 or "," not in r.stdout:
            return f"CUDA device {device}"
        name, driver = (x.strip() for x in r.stdout.strip().splitlines()[0].split(",", 1))
        return f"{name}, driver {driver}, torch {torch.__version__}"
    except Exception:  # noqa: BLE001 - no torch or no nvidia-smi
        return None


# ---- the session ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default=None, help="default: kda with CUDA, softmax under the interpreter")
    ap.add_argument("--variant", action="append", default=[],
                    help="a knob variant to submit, 'KNOB=V[,KNOB=V]'; repeat it (default: three, one knob each "
                         "moved to its neighbouring value)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="wall-clock limit for the whole script")
    ap.add_argument("--out", default="llm-latency-out")
    ap.add_argument("--work", default="/tmp/marathon-latency",
                    help="the server's database, artifacts and logs (emptied first: a cold start)")
    ap.add_argument("--gpu-workdir", default="",
                    help="the GPU worker's cache and input bank (emptied first; default /dev/shm/marathon-latency-gpu "
                         "where /dev/shm exists, else WORK/gpu-work)")
    ap.add_argument("--keep-gpu-workdir", action="store_true",
                    help="leave the GPU worker's directory as an earlier run left it: a worker restarted on a host "
                         "that has served before (its caches: oracles, self-test, ceilings, Triton's kernels and the "
                         "baseline's autotuning; the input bank)")
    ap.add_argument("--device", type=int, default=0, help="the CUDA device of the GPU worker")
    ap.add_argument("--port", type=int, default=7233, help="the dev server's port")
    ap.add_argument("--warm", default="", help="MARATHON_WARM_PROBLEM for the GPU worker (default: none, as started "
                    "by hand)")
    a = ap.parse_args(argv)
    t_begin = time.monotonic()

    def left() -> float:
        return t_begin + a.budget_s - time.monotonic()

    device = device_name(a.device)
    problem = a.problem or ("kda" if device else "softmax")
    variants = [parse_variant(v) for v in a.variant] or neighbour_variants(problem)
    subs = submissions(problem, variants)
    out, work = Path(a.out), Path(a.work)
    gpu_work = Path(a.gpu_workdir or ("/dev/shm/marathon-latency-gpu" if Path("/dev/shm").is_dir()
                                      else work / "gpu-work"))
    for d in (work, gpu_work):
        if d != gpu_work or not a.keep_gpu_workdir:
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    gs.WORK = work  # where gpu_session's helpers write the processes' logs
    # the worker's caches live beside its work directory, so that --keep-gpu-workdir keeps them too
    os.environ.update(MARATHON_HOME=str(work / "home"), MARATHON_ARTIFACTS=str(work / "artifacts"),
                      MARATHON_GPU_WORKDIR=str(gpu_work), MARATHON_CACHE_DIR=str(gpu_work / "cache"),
                      TEMPORAL_ADDRESS=f"127.0.0.1:{a.port}")
    res: dict = {"problem": problem, "device": device or "no CUDA: Triton interpreter", "budget_s": a.budget_s,
                 "run_id": None, "targets": {"verdict_s": TARGET_VERDICT_S, "best_verdict_s": TARGET_BEST_S,
                                                 "rules_verdict_s": TARGET_RULES_S, "first_verdict_s": TARGET_FIRST_S},
                 "gpu_workdir_kept": a.keep_gpu_workdir, "cold_start": {}, "submissions": []}
    procs: dict[str, subprocess.Popen] = {}  # by log name, the dev server first
    marks: list = []
    t0 = None
    server = ChatServer(script(subs))
    try:
        with server:
            if gs.wait_port(a.port, 0.2):
                gs.log(f"port {a.port} is in use: another server; give --port")
                return 1
            procs["dev"] = gs.spawn("dev", ["dev", "--headless", "--db", str(work / "temporal.db"),
                                            "--port", str(a.port)])
            if not gs.wait_port(a.port, min(60, max(1, left() - RESERVE_S))):
                gs.log("the dev server did not come up")
                return 1
            llm_env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "scripted",
                       "MARATHON_MODEL": "scripted-model", "MARATHON_LLM_PROFILE": "openai-chat",
                       "MARATHON_LLM_TIMEOUT": "60"}
            gpu_env = {**gs.gpu_worker_env(a.device), **({"MARATHON_WARM_PROBLEM": a.warm} if a.warm else {})}
            t0 = time.monotonic()  # the cold start: workers and run started together, as by hand
            procs["agent"] = gs.spawn("agent", ["worker", "--role", "agent"], llm_env)
            procs["gpu0"] = gs.spawn("gpu0", ["worker", "--role", "gpu"], gpu_env)
            run_id = f"latency-{problem}-{time.strftime('%Y%m%d-%H%M%S')}"
            r = gs.marathon("start", problem, "--policy", "llm", "--iterations", str(len(subs) + 1),
                            "--id", run_id, timeout=max(5, min(120, left() - RESERVE_S)))
            if r.returncode != 0:
                gs.log(f"marathon start failed: {r.stdout.strip()} {r.stderr.strip()[-1500:]}")
                return 1
            res["run_id"] = run_id
            c = res["cold_start"]
            c["run_started_s"] = round(time.monotonic() - t0, 2)
            gs.log(f"run {run_id}: {len(subs)} submissions scripted")
            next_status = time.monotonic() + 15
            while left() > RESERVE_S:
                turns = server.turns()
                if "gpu_worker_polling_s" not in c and "polling" in (work / "gpu0.log").read_text(errors="replace"):
                    c["gpu_worker_polling_s"] = round(time.monotonic() - t0, 2)
                    gs.log("gpu worker polling")
                if len(turns) > len(subs):
                    break  # the request after the last submission carries its verdict
                dead = [name for name, p in procs.items() if p.poll() is not None]
                if dead:
                    gs.log(f"exited early: {dead}")
                    break
                if time.monotonic() >= next_status:
                    st = gs.status(run_id) or {}
                    gs.log(f"{len(turns)} turns; run phase {st.get('phase')}, iteration {st.get('iteration')}")
                    if st.get("phase") in ("paused", "done"):
                        break
                    next_status = time.monotonic() + 15
                time.sleep(0.5)
            # the run ends by itself (the scripted model idles); waited for only while the budget allows
            end = time.monotonic() + min(30, max(0, left() - RESERVE_S))
            while time.monotonic() < end and (gs.status(run_id) or {}).get("phase") != "done":
                time.sleep(2)
            marks = history_marks(f"127.0.0.1:{a.port}", run_id) if left() > 20 else []
    finally:
        for p in reversed(procs.values()):
            if p.poll() is None:
                p.terminate()
        end = time.monotonic() + 20
        for p in procs.values():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        # what was seen so far, also when the budget or a signal cut the session short
        turns = server.turns()
        if t0 is not None and turns:
            res["cold_start"]["first_turn_s"] = round(turns[0].at - t0, 2)
        if t0 is not None and len(turns) > 1:
            res["cold_start"]["first_verdict_s"] = round(turns[1].at - t0, 2)
        stages = gpu_stages(work / "gpu0.log", res["run_id"] or "-")
        for i, (s, row) in enumerate(zip(subs, verdicts(turns, len(subs))), 1):
            row = {"label": s["label"], "kind": s["kind"], **row}
            split(row, marks, stages, i)
            res["submissions"].append(row)
        (out / "logs").mkdir(exist_ok=True)
        for f in work.glob("*.log"):
            shutil.copy(f, out / "logs" / f.name)
        (out / "latency.json").write_text(json.dumps(res, indent=1, default=str))
        text = markdown(res)
        (out / "latency.md").write_text(text)
        print("==== LATENCY ====")
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    import signal

    # `timeout` sends SIGTERM: unwind through main's finally, so the processes stop and the results are written
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(124)))
    sys.exit(main())
