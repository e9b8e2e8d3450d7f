"""The commands that run on this machine and need no server: problems, verify, selftest, bench, llm-check."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

from cli.errors import UsageError
from cli.spec import is_problem_path


async def cmd_llm_check(args) -> int:
    """One tiny request to the model endpoint configured in this environment (the agent worker's):
    what works, what adapts, what to change. Exit 0 if a run can use it."""
    from activities.llm.check import llm_check

    ok, lines = llm_check(args.model, args.profile)
    for line in lines:
        print(line)
    return 0 if ok else 1


def knob_values(space: dict) -> str:
    """A knob space in one line: `NAME = v1, v2; ...` (an empty string shown as '')."""
    return "; ".join(f"{k} = " + ", ".join(repr(v) if v == "" else str(v) for v in vs) for k, vs in space.items())


async def cmd_problems(args) -> int:
    """The built-in problems (or the one named); with a path, that problem file or folder, checked the way a
    run loads it."""
    from baselines.registry import get_problem, problem_names

    if args.path and args.path not in problem_names():
        if not is_problem_path(args.path) and not args.path.startswith(("file:", "folder:")):  # a mistyped name
            raise UsageError(f"unknown problem {args.path!r}; known problems: {', '.join(problem_names())} "
                             "(or a problem file or folder)")
        return describe_problem_path(args.path, args.json)
    rows = []
    for name in [args.path] if args.path else problem_names():
        p = get_problem(name)
        rows.append({"name": name, "description": p.description, "shapes": [s.name for s in p.shapes],
                     "cpu_shape": p.cpu_shape.name, "distributions": list(p.distributions),
                     "knobs": p.knob_space()})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']}: {r['description']}")
        print(f"  shapes: {r['shapes'][0]} (primary)" + "".join(f", {s}" for s in r["shapes"][1:])
              + f"; without a GPU: {r['cpu_shape']}")
        print(f"  input distributions: {', '.join(r['distributions'])}")
        print(f"  knobs: {knob_values(r['knobs'])}")
    return 0


def describe_problem_path(path: str, as_json: bool = False) -> int:
    """`marathon problems PATH`: load a problem file or folder as `marathon start PATH` would, run the checks
    a run here would, and print what it is; anything wrong is one line (UsageError). Nothing is stored."""
    from baselines.external.folder import is_folder_key
    from cli.spec import cuda_here

    from cli.spec import check_problem_file, load_problem_path

    p = load_problem_path(path)
    folder = is_folder_key(p.name)
    policies = []
    for policy in ("search", "llm"):
        try:
            check_problem_file(p, policy, None)
            policies.append(policy)
        except UsageError as e:
            refusal = str(e)
    if not policies:
        raise UsageError(refusal)
    shapes = [{"name": s.name, **s.params} for s in p.shapes]
    row = {"path": path, "key": p.name, "kind": "folder" if folder else "file", "description": p.description,
           "shapes": shapes, "distributions": list(p.distributions), "outputs": list(p.outputs),
           "knobs": p.knob_space() if "search" in policies else {}, "policies": policies}
    if as_json:
        print(json.dumps(row, indent=2, default=str))
        return 0
    print(f"{path}: a problem {'folder' if folder else 'file'}, key {p.name}")
    print(f"  {p.description}")
    if folder:
        for s in p.shapes:
            print(f"  shape {s.name}: " + ", ".join(f"{k}={v}" for k, v in s.params.items()))
        print(f"  without a GPU: {p.cpu_shape.name}")
        print(f"  outputs: {', '.join(p.outputs)}")
    else:  # the inputs' and outputs' names, shapes and dtypes, as the model is told them
        for line in p.contract_text().splitlines()[4:]:
            print(f"  {line}")
    print(f"  input distributions: {', '.join(p.distributions)}")
    if row["knobs"]:
        print(f"  knobs: {knob_values(row['knobs'])}")
    if folder:
        print(f"OK: `marathon start {path}` starts a run of it (policies: {', '.join(policies)})")
    else:
        where = "for GPU workers" if cuda_here() else "here, under the Triton interpreter on its CPU inputs"
        print(f"OK: `marathon start {path} --policy llm` starts a run of it {where}; the search policy "
              f"tunes a starting kernel you hand in: `marathon start {path} --kernel START.py`")
    return 0


async def cmd_verify(args) -> int:
    """The harness's verification of a kernel file against a problem, on this machine."""
    from cli.export import ExportError, verify_kernel

    def started(line: str) -> None:  # once the input is good: how long a kernel that never returns may take
        print(f"{line}; Ctrl-C stops it now", file=sys.stderr, flush=True)

    try:
        ok, lines = await in_daemon_thread(verify_kernel, args.problem, Path(args.kernel), args.shape, started)
    except ExportError as e:
        raise UsageError(str(e))
    for line in lines:
        print(line)
    return 0 if ok else 1


def in_daemon_thread(fn, *args) -> asyncio.Future:
    """fn(*args) on a daemon thread, awaited: an interrupted command ends without waiting for it (asyncio's
    own threads are joined at exit), and the sandbox children it started end with this process (their fork
    server ends them once it is gone)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(how, value):
        if not done.done():
            how(value)

    def work():
        try:
            outcome = (done.set_result, fn(*args))
        except BaseException as e:  # noqa: BLE001 - raised where it is awaited
            outcome = (done.set_exception, e)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the command was interrupted and its loop closed: nobody waits
            pass

    threading.Thread(target=work, name=getattr(fn, "__name__", "work"), daemon=True).start()
    return done


async def cmd_selftest(args) -> int:
    from gpu_worker.activities import GpuActivities, evaluator

    print(json.dumps(GpuActivities(evaluator()).gpu_selftest(), indent=2, default=str))
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
