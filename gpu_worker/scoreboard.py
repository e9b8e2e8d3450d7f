"""`marathon bench [PROBLEM ...]`: the scoreboard on this GPU, written to docs/scoreboard.{md,json}.

For every problem and shape: the starting kernel and the kernels found by a run (`--best
PROBLEM=SOURCE_KEY`, as often as there are candidates, e.g. a run's crowned best and its fastest passing
candidates from its ledger) go through the harness exactly as the loop sends candidates (verify against the
oracle, then benchmark interleaved with the primary baseline), and the problem's other baselines are timed
beside them. The row's best is the fastest candidate that passed, if it beats the starting kernel; every
candidate's measurement stays in the row (`candidates`). Rows carry the harness's receipts and the time
they were measured. `--merge A.json B.json ...` measures nothing: it writes the rows of several runs (shapes
measured by separate processes, or on several GPUs) as one scoreboard.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from workflows.artifacts import ArtifactStore, ArtifactStoreError, candidate_id
from workflows.contracts import BenchRequest, EvalRequest


def _time_other_baselines(problem, shape, skip: str) -> dict[str, dict]:
    """Device ms of each secondary baseline per distribution (gpu_worker.devicetime: a CUDA graph per
    rotated input copy, in this process; they are trusted code)."""
    import torch

    from gpu_worker.devicetime import graph_time_ms, rotated_copies

    out = {}
    for name, fn in problem.baselines().items():
        if name == skip:
            continue
        out[name] = {}
        for dist in problem.distributions:
            try:
                sets = rotated_copies(lambda i: problem.make_inputs(shape, dist, 5000 + i, "cuda"))
                out[name][dist] = graph_time_ms(lambda inp: fn(inp), sets)["ms"]
                del sets
            except Exception as e:  # e.g. SDPA refusing a head dim: reported, not fatal
                out[name][dist] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return out


def measure(ev, store, problem, shape, source: str) -> dict:
    """One kernel through the harness on one shape; `phases`: the seconds each step of verify and benchmark
    took (gpu_worker.phases), which is where a row's wall time goes."""
    from gpu_worker.phases import phases_begin, phases_end

    key = store.put_text(source)
    cid = candidate_id(source)
    phases_begin()
    ver = ev.verify(EvalRequest(problem=problem.name, candidate_id=cid, source_key=key, shape=shape.name))
    row = {"candidate_id": cid, "source_key": key, "ok": ver.ok, "rel_err": ver.rel_err,
           "baseline_rel_err": ver.baseline_rel_err, "threshold": ver.threshold,
           "phases": {"verify": phases_end()}}
    if not ver.ok:
        row["reason"] = ver.reason
        return row
    phases_begin()
    b = ev.benchmark(BenchRequest(problem=problem.name, candidate_id=cid, source_key=key, shape=shape.name))
    row["phases"]["benchmark"] = phases_end()
    row.update(ok=b.ok, time_ms=b.time_ms, baseline_ms=b.baseline_ms, baseline_name=b.baseline_name,
               speedup=b.speedup, speedup_ci=b.speedup_ci, geomean_speedup=b.geomean_speedup,
               deciding_dist=b.deciding_dist, host_ms=b.host_ms, baseline_host_ms=b.baseline_host_ms,
               distributions=[d.model_dump() for d in b.distributions],
               receipt=b.receipt.model_dump() if b.receipt else None)
    if not b.ok:
        row["reason"] = b.reason
    return row


def fastest_passing(start: dict, candidates: list[dict]) -> dict:
    """The row's best: the fastest candidate that passed, if it beats the starting kernel or the starting
    kernel did not pass; else the starting kernel. Of equal times the one given first wins (the run's crowned
    best comes first)."""
    passing = [c for c in candidates if c.get("ok") and c.get("time_ms") is not None]
    top = min(passing, key=lambda c: c["time_ms"], default=None)
    if top is not None and (not start.get("ok") or top["time_ms"] < start["time_ms"]):
        return top
    return start


def make_row(problem: str, shape: str, baseline: str, start: dict, found: list[dict], others: dict,
             floor: float | None, seconds: float) -> dict:
    """One scoreboard row from `measure`'s results for the starting kernel and the run's candidates (`found`),
    the other baselines' times and the shape's floor."""
    top = fastest_passing(start, found)
    return {"problem": problem, "shape": shape, "baseline": baseline,
            "baseline_ms": start.get("baseline_ms"), "other_baselines_ms": others,
            "baseline_rel_err": start.get("baseline_rel_err"),
            "start_ms": start.get("time_ms"), "start_rel_err": start.get("rel_err"),
            "start_ok": start.get("ok"), "start_reason": start.get("reason"),
            "best_ms": top.get("time_ms"), "best_rel_err": top.get("rel_err"),
            "best_candidate": top.get("candidate_id"), "best_from": "start" if top is start else "run",
            "best_speedup": top.get("speedup"), "best_speedup_ci": top.get("speedup_ci"),
            "best_geomean_speedup": top.get("geomean_speedup"), "deciding_dist": top.get("deciding_dist"),
            "best_host_ms": top.get("host_ms"), "baseline_host_ms": top.get("baseline_host_ms"),
            "start_distributions": start.get("distributions") or [], "start_phases": start.get("phases"),
            "best_distributions": top.get("distributions") or [],
            "speedups_vs_other_baselines": {
                k: min(v[d["dist"]] / d["time_ms"] for d in top.get("distributions") or [] if d["dist"] in v)
                for k, v in others.items()
                if top.get("distributions") and all(isinstance(x, float) for x in v.values())},
            "floor_ms": floor,
            "percent_of_floor": (100 * floor / top["time_ms"]) if floor and top.get("time_ms") else None,
            "receipt": top.get("receipt"), "candidates": [candidate_summary(c) for c in found],
            "seconds": round(seconds, 1), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def candidate_summary(measured: dict) -> dict:
    """What a row keeps of each candidate measured (the chosen one's full receipt is the row's own)."""
    return {k: measured.get(k) for k in ("source_key", "candidate_id", "ok", "time_ms", "rel_err", "speedup",
                                         "deciding_dist", "host_ms", "reason")}


def parse_best(args: list[str], measured: list[str]) -> dict[str, list[str]]:
    """`--best PROBLEM=SOURCE_KEY` arguments, several allowed per problem: {problem: [source keys]}, in the
    order given, each key once. `measured`: the problems of the targets; a --best for any other problem
    would be silently dropped, so it is refused."""
    from baselines.registry import problem_names

    best: dict[str, list[str]] = {}
    for arg in args:
        name, eq, key = arg.partition("=")
        if not (eq and name and key):
            raise SystemExit(f"marathon bench: --best {arg!r}: expected PROBLEM=SOURCE_KEY")
        if name not in problem_names():
            raise SystemExit(f"marathon bench: --best {arg!r}: unknown problem {name!r}; known problems: "
                             + ", ".join(problem_names()))
        if name not in measured:
            raise SystemExit(f"marathon bench: --best {arg!r}: {name} is not among the problems measured "
                             f"({', '.join(measured)})")
        if key not in best.setdefault(name, []):
            best[name].append(key)
    return best


def parse_target(arg: str) -> tuple[str, list[int] | None]:
    """`PROBLEM` or `PROBLEM@I,J`: a problem, optionally only its shapes number I, J (0 is the primary, in
    the order the problem lists them), so that one problem's rows can be measured on several GPUs."""
    name, _, idx = arg.partition("@")
    if not idx:
        return name, None
    try:
        return name, [int(i) for i in idx.split(",")]
    except ValueError:
        raise SystemExit(f"marathon bench: {arg!r}: expected PROBLEM or PROBLEM@I,J with shape numbers") from None


def run(problems: list[str], best: dict[str, list[str]], primary_only: bool, out_dir: Path,
        settings=None) -> list[dict]:
    """`best`: {problem: [source keys of candidate kernels]}, each measured on every shape of the problem.
    `settings`: the GPU worker's (gpu_worker.settings; None: the defaults)."""
    from baselines.registry import get_problem
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler
    from gpu_worker.settings import GpuWorkerSettings, cuda_available

    settings = settings or GpuWorkerSettings()

    store = ArtifactStore()
    sources = {}  # every candidate read before anything is measured: a wrong key fails now, not hours in
    for name, keys in best.items():
        for key in keys:
            try:
                sources[key] = store.get_text(key)
            except ArtifactStoreError as e:
                raise SystemExit(f"marathon bench: --best {name}={key}: {e}") from None
    if not cuda_available(settings):
        raise SystemExit("marathon bench needs a CUDA GPU (the scoreboard is GPU timings only)")
    ev = Evaluator(store=store, scheduler=Scheduler.under(settings), settings=settings)
    rows = []
    try:
        for target in problems:
            name, idx = parse_target(target)
            problem = get_problem(name)
            start_src = problem.render(problem.default_knobs())
            shapes = [problem.shapes[i] for i in idx] if idx is not None else problem.shapes
            for shape in shapes[:1] if primary_only else shapes:
                t0 = time.time()
                start = measure(ev, store, problem, shape, start_src)
                found = [measure(ev, store, problem, shape, sources[key]) for key in best.get(name, [])]
                primary = start.get("baseline_name") or next(iter(problem.baselines()))
                others = _time_other_baselines(problem, shape, primary)
                ceil = ev.ceilings
                floor = (problem.floor_ms(shape, ceil.bandwidth, ceil.flops) if ceil else None)
                row = make_row(name, shape.name, primary, start, found, others, floor, time.time() - t0)
                rows.append(row)
                print(_line(row), flush=True)
                write(rows, out_dir)  # after every row: a run cut short still leaves what it measured
    finally:
        ev.close()
    return rows


def _f(x, fmt="{:.4g}"):
    return fmt.format(x) if isinstance(x, (int, float)) else ("-" if x is None else str(x))


def _line(r: dict) -> str:
    return (f"{r['problem']:<12} {r['shape']:<26} baseline {_f(r['baseline_ms'])} ms  start {_f(r['start_ms'])} ms  "
            f"best {_f(r['best_ms'])} ms  speedup {_f(r['best_speedup'], '{:.3f}')}x  "
            f"floor {_f(r['floor_ms'])} ms ({_f(r['percent_of_floor'], '{:.1f}')}%)")


def merge(files: list[str]) -> list[dict]:
    """The rows of several scoreboard.json files (shapes measured by separate processes, or on several GPUs)
    as one scoreboard: of a (problem, shape) measured more than once, the row of the later file counts. Rows
    come in the registry's order of problems and each problem's order of shapes; any other after them."""
    from baselines.registry import get_problem, problem_names

    order = {name: i for i, name in enumerate(problem_names())}
    rows: dict[tuple[str, str], dict] = {}
    for f in files:
        try:
            got = json.loads(Path(f).read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"marathon bench: --merge {f}: {e}") from None
        if not isinstance(got, list) or not all(isinstance(r, dict) and "problem" in r and "shape" in r
                                                for r in got):
            raise SystemExit(f"marathon bench: --merge {f}: not a scoreboard.json (a list of rows, each with "
                             "a problem and a shape)")
        for r in got:
            rows[(r["problem"], r["shape"])] = r

    def place(key: tuple[str, str]) -> tuple[int, int]:
        if key[0] not in order:
            return len(order), 0
        names = [s.name for s in get_problem(key[0]).shapes]
        return order[key[0]], names.index(key[1]) if key[1] in names else len(names)

    return [rows[k] for k in sorted(rows, key=place)]  # sorted is stable: ties keep first-seen order


def _environment(rec: dict) -> str:
    return (f"{rec.get('device', '?')} (driver {rec.get('driver', '?')}, torch {rec.get('torch', '?')}, "
            f"triton {rec.get('triton', '?')})")


def write(rows: list[dict], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scoreboard.json").write_text(json.dumps(rows, indent=1, default=str))
    recs = [r.get("receipt") or {} for r in rows]
    envs = list(dict.fromkeys(_environment(rec) for rec in recs if rec))
    lines = ["# Scoreboard", "",
             f"Produced by `marathon bench` on {' and '.join(envs) or '?'}. When each row was measured, and "
             "the GPU's clocks as its benchmark began:", ""]
    lines += [f"- {r['problem']} {r['shape']}: {r.get('measured_at', '?')}, "
              + (f"on {_environment(rec)}, " if len(envs) > 1 else "") + f"clocks {rec.get('clocks', '?')}"
              for r, rec in zip(rows, recs)]
    lines += ["",
             "Times: device time, medians in ms, as the harness judges (CUDA-graph replay when both sides capture, "
             "else back to back with the host ahead; inputs refilled from fresh values and L2 flushed before every "
             "repetition; interleaved with the primary baseline). Every input distribution is timed and the worst "
             "speedup decides. Host: latency of one synchronous call (launches included), its own figure, never "
             "in a speedup. Other baselines: a CUDA graph per rotated input copy (gpu_worker.devicetime), worst "
             "speedup over distributions. Errors: relative RMS against the fp64 oracle (worst over seeds and "
             "distributions).", "",
             "| problem | shape | baseline | per distribution: baseline ms / start ms (speedup) | start mode | "
             "host ms: baseline / start | other baselines ms | start err | best ms | best speedup, worst (95% CI) "
             "| geomean | floor ms | % of floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        others = "; ".join(f"{k} " + ", ".join(f"{d} {_f(x)}" for d, x in v.items())
                           if isinstance(v, dict) else f"{k} {_f(v)}"
                           for k, v in r["other_baselines_ms"].items()) or "-"
        ci = r.get("best_speedup_ci")
        sp = f"{_f(r['best_speedup'], '{:.3f}')}x" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        sp += f" [{r['deciding_dist']}]" if r.get("deciding_dist") else ""
        dists = r.get("start_distributions") or []
        per = "; ".join(f"{d['dist']}: {_f(d['baseline_ms'])} / {_f(d['time_ms'])} ({d['speedup']:.3f}x)"
                        for d in dists) if r["start_ok"] else f"rejected: {str(r.get('start_reason'))[:60]}"
        modes = ", ".join(sorted({d.get("mode", "") for d in dists})) or "-"
        host = (f"{_f(dists[0].get('baseline_host_ms'))} / {_f(dists[0].get('host_ms'))}" if dists else "-")
        n = len(r.get("candidates") or [])
        best_from = r["best_from"]
        if n > 1:  # which of several won, and out of how many
            best_from += (f" {r['best_candidate']}" if best_from == "run" else "") + f", {n} candidates"
        lines.append(f"| {r['problem']} | {r['shape']} | {r['baseline']} | {per} | {modes} | {host} | {others} | "
                     f"{_f(r['start_rel_err'], '{:.2e}')} | {_f(r['best_ms'])} ({best_from}) | {sp} | "
                     f"{_f(r.get('best_geomean_speedup'), '{:.3f}')} | "
                     f"{_f(r['floor_ms'])} | {_f(r['percent_of_floor'], '{:.1f}')} |")
    (out_dir / "scoreboard.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from baselines.registry import check_problem_name, get_problem, problem_names

    ap = argparse.ArgumentParser(prog="marathon bench")
    ap.add_argument("problems", nargs="*", help="PROBLEM, or PROBLEM@I,J for only its shapes number I and J")
    ap.add_argument("--best", action="append", default=[],
                    help="PROBLEM=SOURCE_KEY of a run's kernel; repeat it to measure several, the fastest counts")
    ap.add_argument("--primary-only", action="store_true")
    ap.add_argument("--merge", nargs="+", metavar="SCOREBOARD_JSON",
                    help="measure nothing: write the rows of these scoreboard.json files as one (a later file's "
                         "row replaces an earlier one of the same problem and shape)")
    ap.add_argument("--out", default="docs")
    a = ap.parse_args(argv)
    if a.merge:
        if a.problems or a.best or a.primary_only:
            raise SystemExit("marathon bench: --merge measures nothing: give it no problems, --best or "
                             "--primary-only")
        write(merge(a.merge), Path(a.out))
        return 0
    names = a.problems or [n for n in problem_names() if n != "softmax"]
    for n in names:  # every target checked before anything is measured
        name, idx = parse_target(n)
        shapes = get_problem(check_problem_name(name)).shapes
        if idx is not None and not all(0 <= i < len(shapes) for i in idx):
            raise SystemExit(f"marathon bench: {n!r}: {name} has shapes "
                             + "; ".join(f"{i} {s.name}" for i, s in enumerate(shapes)))
    best = parse_best(a.best, list(dict.fromkeys(parse_target(n)[0] for n in names)))
    from gpu_worker.settings import GpuWorkerSettings, SettingsError

    try:  # the GPU worker's settings, as a worker reads them at its start
        settings = GpuWorkerSettings.from_env(os.environ)
    except SettingsError as e:
        raise SystemExit(f"marathon bench: {e}") from None
    run(names, best, a.primary_only, Path(a.out), settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
