"""The commands that run on this machine and need no server: problems, verify, selftest, bench, llm-check."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from activities.cli.errors import UsageError

async def cmd_llm_check(args) -> int:
    """One tiny request to the model endpoint configured in this environment (the agent worker's):
    what works, what adapts, what to change. Exit 0 if a run can use it."""
    from activities.llm.check import llm_check

    ok, lines = llm_check(args.model, args.profile)
    for line in lines:
        print(line)
    return 0 if ok else 1



async def cmd_problems(args) -> int:
    from baselines.registry import get_problem, problem_names

    rows = []
    for name in problem_names():
        p = get_problem(name)
        rows.append({"name": name, "description": p.description, "shapes": [s.name for s in p.shapes],
                     "cpu_shape": p.cpu_shape.name, "distributions": list(p.distributions),
                     "knobs": list(p.knob_space())})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']}: {r['description']}")
        print(f"  shapes: {r['shapes'][0]} (primary)" + "".join(f", {s}" for s in r["shapes"][1:])
              + f"; without a GPU: {r['cpu_shape']}")
        print(f"  input distributions: {', '.join(r['distributions'])}")
        print(f"  knobs: {', '.join(r['knobs'])}")
    return 0



async def cmd_verify(args) -> int:
    """The harness's verification of a kernel file against a problem, on this machine."""
    from activities.export import ExportError, verify_kernel

    try:
        ok, lines = await asyncio.to_thread(verify_kernel, args.problem, Path(args.kernel), args.shape)
    except ExportError as e:
        raise UsageError(str(e))
    for line in lines:
        print(line)
    return 0 if ok else 1


async def cmd_selftest(args) -> int:
    from gpu_worker.activities import gpu_selftest

    print(json.dumps(gpu_selftest(), indent=2, default=str))
    return 0


async def cmd_bench(args) -> int:
    from gpu_worker.scoreboard import main as scoreboard

    argv = (list(args.problems) + [x for b in args.best for x in ("--best", b)] + ["--out", args.out]
            + (["--merge", *args.merge] if args.merge else []))
    from baselines.registry import UnknownProblem

    try:
        return scoreboard(argv + (["--primary-only"] if args.primary_only else []))
    except UnknownProblem as e:
        raise UsageError(str(e)) from None
    except SystemExit as e:
        if isinstance(e.code, str):  # the scoreboard's own refusals: one line, like every bad input
            raise UsageError(e.code.removeprefix("marathon bench: ").removeprefix("marathon ")) from None
        raise
