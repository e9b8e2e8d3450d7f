"""`marathon bench [PROBLEM ...]`: the scoreboard on this GPU, written to docs/scoreboard.{md,json}.

For every problem and shape: the starting kernel and the best kernel found by a run (`--best
PROBLEM=SOURCE_KEY`, e.g. from `marathon status ID --json`) go through the harness exactly as the loop
sends candidates (verify against the oracle, then benchmark interleaved with the primary baseline), and
the problem's other baselines are timed beside them. Rows carry the harness's receipts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from activities.artifacts import ArtifactStore
from activities.search import candidate_id
from workflows.contracts import BenchRequest, EvalRequest


def _time_other_baselines(problem, shape, skip: str) -> dict[str, float]:
    """Median ms of each secondary baseline (triton.testing.do_bench, which clears L2 between reps)."""
    import torch
    import triton.testing

    out = {}
    inputs = problem.make_inputs(shape, problem.distributions[0], 0, "cuda")
    for name, fn in problem.baselines().items():
        if name == skip:
            continue
        try:
            out[name] = float(triton.testing.do_bench(lambda: fn(inputs), warmup=25, rep=200, return_mode="median"))
        except Exception as e:  # e.g. SDPA refusing a head dim: reported, not fatal
            out[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
    return out


def measure(ev, store, problem, shape, source: str) -> dict:
    key = store.put_text(source)
    cid = candidate_id(source)
    ver = ev.verify(EvalRequest(problem=problem.name, candidate_id=cid, source_key=key, shape=shape.name))
    row = {"candidate_id": cid, "source_key": key, "ok": ver.ok, "rel_err": ver.rel_err,
           "baseline_rel_err": ver.baseline_rel_err, "threshold": ver.threshold}
    if not ver.ok:
        row["reason"] = ver.reason
        return row
    b = ev.benchmark(BenchRequest(problem=problem.name, candidate_id=cid, source_key=key, shape=shape.name))
    row.update(ok=b.ok, time_ms=b.time_ms, baseline_ms=b.baseline_ms, baseline_name=b.baseline_name,
               speedup=b.speedup, speedup_ci=b.speedup_ci,
               receipt=b.receipt.model_dump() if b.receipt else None)
    if not b.ok:
        row["reason"] = b.reason
    return row


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


def run(problems: list[str], best: dict[str, str], primary_only: bool, out_dir: Path) -> list[dict]:
    from baselines.registry import get_problem
    from gpu_worker.harness import Evaluator, cuda_available

    if not cuda_available():
        raise SystemExit("marathon bench needs a CUDA GPU (the scoreboard is GPU timings only)")
    store = ArtifactStore()
    ev = Evaluator(store=store)
    rows = []
    try:
        for target in problems:
            name, idx = parse_target(target)
            problem = get_problem(name)
            start_src = problem.render(problem.default_knobs())
            best_src = store.get_text(best[name]) if name in best else None
            shapes = [problem.shapes[i] for i in idx] if idx is not None else problem.shapes
            for shape in shapes[:1] if primary_only else shapes:
                t0 = time.time()
                start = measure(ev, store, problem, shape, start_src)
                found = measure(ev, store, problem, shape, best_src) if best_src else None
                primary = start.get("baseline_name") or next(iter(problem.baselines()))
                others = _time_other_baselines(problem, shape, primary)
                ceil = ev.ceilings or {}
                floor = (problem.floor_ms(shape, ceil["bandwidth"], ceil["flops"]) if ceil else None)
                top = found if found and found.get("ok") and (not start.get("ok") or
                                                              found["time_ms"] < start["time_ms"]) else start
                row = {"problem": name, "shape": shape.name, "baseline": primary,
                       "baseline_ms": start.get("baseline_ms"), "other_baselines_ms": others,
                       "baseline_rel_err": start.get("baseline_rel_err"),
                       "start_ms": start.get("time_ms"), "start_rel_err": start.get("rel_err"),
                       "start_ok": start.get("ok"), "start_reason": start.get("reason"),
                       "best_ms": top.get("time_ms"), "best_rel_err": top.get("rel_err"),
                       "best_candidate": top.get("candidate_id"), "best_from": "run" if top is found else "start",
                       "best_speedup": top.get("speedup"), "best_speedup_ci": top.get("speedup_ci"),
                       "speedups_vs_other_baselines": {k: v / top["time_ms"] for k, v in others.items()
                                                       if isinstance(v, float) and top.get("time_ms")},
                       "floor_ms": floor,
                       "percent_of_floor": (100 * floor / top["time_ms"]) if floor and top.get("time_ms") else None,
                       "receipt": top.get("receipt"), "seconds": round(time.time() - t0, 1)}
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


def write(rows: list[dict], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scoreboard.json").write_text(json.dumps(rows, indent=1, default=str))
    rec = next((r["receipt"] for r in rows if r.get("receipt")), None) or {}
    lines = ["# Scoreboard", "",
             f"Produced by `marathon bench` on {rec.get('device', '?')} (driver {rec.get('driver', '?')}, "
             f"torch {rec.get('torch', '?')}, triton {rec.get('triton', '?')}, clocks at start: "
             f"{rec.get('clocks', '?')}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
             "Times: harness median (interleaved with the primary baseline, L2 flushed, buffers rotated); "
             "other baselines: triton.testing.do_bench median. Errors: relative RMS against the fp64 oracle "
             "(worst over seeds and distributions).", "",
             "| problem | shape | baseline | baseline ms | other baselines ms | baseline err | start ms | start err "
             "| best ms | best err | best speedup (95% CI) | floor ms | % of floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        others = ", ".join(f"{k} {_f(v)}" for k, v in r["other_baselines_ms"].items()) or "-"
        ci = r.get("best_speedup_ci")
        sp = f"{_f(r['best_speedup'], '{:.3f}')}x" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")
        start = _f(r["start_ms"]) if r["start_ok"] else f"rejected: {str(r.get('start_reason'))[:60]}"
        lines.append(f"| {r['problem']} | {r['shape']} | {r['baseline']} | {_f(r['baseline_ms'])} | {others} | "
                     f"{_f(r['baseline_rel_err'], '{:.2e}')} | {start} | {_f(r['start_rel_err'], '{:.2e}')} | "
                     f"{_f(r['best_ms'])} ({r['best_from']}) | {_f(r['best_rel_err'], '{:.2e}')} | {sp} | "
                     f"{_f(r['floor_ms'])} | {_f(r['percent_of_floor'], '{:.1f}')} |")
    (out_dir / "scoreboard.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    from baselines.registry import check_problem_name, get_problem, problem_names

    ap = argparse.ArgumentParser(prog="marathon bench")
    ap.add_argument("problems", nargs="*", help="PROBLEM, or PROBLEM@I,J for only its shapes number I and J")
    ap.add_argument("--best", action="append", default=[], help="PROBLEM=SOURCE_KEY of a run's best kernel")
    ap.add_argument("--primary-only", action="store_true")
    ap.add_argument("--out", default="docs")
    a = ap.parse_args(argv)
    names = a.problems or [n for n in problem_names() if n != "softmax"]
    for n in names:  # every target checked before anything is measured
        name, idx = parse_target(n)
        shapes = get_problem(check_problem_name(name)).shapes
        if idx is not None and not all(0 <= i < len(shapes) for i in idx):
            raise SystemExit(f"marathon bench: {n!r}: {name} has shapes "
                             + "; ".join(f"{i} {s.name}" for i, s in enumerate(shapes)))
    best = dict(b.split("=", 1) for b in a.best)
    run(names, best, a.primary_only, Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
