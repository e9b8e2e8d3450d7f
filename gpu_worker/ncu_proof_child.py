"""The Nsight Compute proof's process: `python -m gpu_worker.ncu_proof_child SPEC.json`, started under ncu
by the harness (gpu_worker.harness.ncu_proof) in a fresh process of its own.

It is a candidate child in all but its channel (gpu_worker.child.Server: the same trusted references and
pins, the same load behind the guard and the OS wall, the same static timing set and L2 flush), run as a
script: trusted work first (its context, the timing set, a rehearsal of one repetition's refill and flush,
the marker kernels compiled and launched once), the OPEN marker, the candidate's import and its kernels'
compilation (Triton's warmup path, as the judge compiles them), then `warmup + reps` calls, each bracketed
by the BEGIN and END markers, its values drawn from a key the OS gives only after the call before it
returned and the device synchronized. The harness reads the trace ncu writes (gpu_worker.ncu_trace); what
this process writes itself (`ready.json`, `done.json` in its directory) is the candidate's
side: it can refuse (the guard's refusals there count) but never prove: only the trace proves.

SPEC (written by the harness, read-only here): source, problem, shape, dist, seed, rotate, pool, warmup, reps,
markers [open, begin, end], marker_dir, tmp (this process's writable directory), device and go (the files
whose appearance lets it onto the device, then starts the calls: the harness's device turns), wait_s,
settle_s, unix_sockets, trusted_roots, harness_pid (the worker: its end ends the waits), opened (the file
it writes once its trusted set-up has ended, before the candidate's import: outside the candidate's
writable directory)."""

from __future__ import annotations

import json
import os
import sys
import time

MARKER_SOURCE = '''import triton
import triton.language as tl
{kernels}'''
MARKER_KERNEL = '''

@triton.jit
def {name}(p):
    tl.store(p, tl.load(p) + 1)
'''


def marker_source(names) -> str:
    """Three trivial Triton kernels under the proof's fresh names: one store each, a few microseconds."""
    return MARKER_SOURCE.format(kernels="".join(MARKER_KERNEL.format(name=n) for n in names))


def _load_markers(directory: str, names) -> list:
    import importlib.util

    path = os.path.join(directory, "proof_markers.py")
    with open(path, "w") as f:
        f.write(marker_source(names))
    spec = importlib.util.spec_from_file_location("proof_markers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return [getattr(mod, n) for n in names]


def _write(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _harness_ended(pid: int | None) -> bool:
    """Whether the process that started this proof (the GPU worker) has ended: a proof whose worker was
    killed stops waiting at once instead of holding its CUDA context for the whole wait. A signal the OS
    wall refuses (EPERM) means the worker lives; only ESRCH means it is gone."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _wait_for(path: str, wait_s: float, harness_pid: int | None = None) -> str | None:
    """None once `path` exists; else why not: the wait ran out or the harness ended."""
    deadline = time.monotonic() + wait_s
    polls = 0
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return None
        polls += 1
        if polls % 100 == 0 and _harness_ended(harness_pid):  # about every half second
            return "the harness ended"
        time.sleep(0.005)
    return f"none in {wait_s:g} s"


def run(spec: dict) -> dict:
    """The proof's calls (see the module's docstring); returns what `done.json` says."""
    import torch

    from gpu_worker import guard_record as guard
    from gpu_worker.child import Server
    from gpu_worker.settings import GpuWorkerSettings
    from gpu_worker.timing_inputs import draw_key

    tmp = spec["tmp"]
    server = Server(tmp, "candidate", GpuWorkerSettings.from_child(os.environ.pop("MARATHON_CHILD_SETTINGS", None)))
    # host work so far; the device only once the harness holds an untimed job's turn for it (as a child's
    # context and uploads are made: never beside another process's timing block)
    _write(os.path.join(tmp, "host.json"), {"pid": os.getpid()})
    why = _wait_for(spec["device"], spec["wait_s"], spec.get("harness_pid"))
    if why:
        return {"error": f"no device turn ({why})"}
    server.cmd_cuda_init()  # (the harness proves on CUDA only; under the interpreter the same steps run on the CPU)
    server.cmd_warm_triton()
    # trusted work only, before the candidate exists: every kernel name here is the trusted side's vocabulary
    flag = torch.zeros(1, dtype=torch.int32, device=server.core.device)
    markers = _load_markers(spec["marker_dir"], spec["markers"])
    open_k, begin, end = markers
    server.core._setup_problem(spec["problem"], spec["shape"])
    server.timing._prepare_timing(spec["rotate"], spec["dist"], spec["seed"], spec["pool"])
    ts = server.timing._timing_set(spec["dist"], "proof")
    urandom, sync = server.core.T["urandom"], server.core._sync
    for e in range(spec["pool"]):  # every pool entry's refill, poison and flush once: their kernels' names
        server.timing._before_rep(ts, e % len(ts.sets), e, draw_key(urandom))
    begin[(1,)](flag)
    end[(1,)](flag)
    sync()
    open_k[(1,)](flag)
    sync()
    # the trusted set-up has ended: the harness's sign, where the candidate, behind its wall, cannot unmake it
    _write(spec["opened"], {})
    server.core.unix_sockets = bool(spec.get("unix_sockets"))  # read by cmd_load for the OS wall (ncu's channel)
    loaded = server.loading.cmd_load(spec["source"], spec["problem"], spec["shape"], [], spec.get("trusted_roots", []))
    _write(os.path.join(tmp, "loaded.json"), {"kernels": loaded.kernels})  # the device job ends here
    refusals: list[str] = []
    if server.cuda:  # compiled as the judge compiles (Triton's warmup path), before the harness's timing turn
        try:
            server.cmd_compile(spec["dist"])
        except guard.GuardViolation as e:  # refused in-process: noted, the calls go on for the trace
            refusals.append(f"compile: {e}"[:300])
    fn = server.timing._fn()
    _write(os.path.join(tmp, "ready.json"), {"kernels": loaded.kernels, "wall": loaded.wall})
    why = _wait_for(spec["go"], spec["wait_s"], spec.get("harness_pid"))
    if why:
        return {"error": f"no go signal ({why})"}
    for i in range(spec["warmup"] + spec["reps"]):
        r = i % len(ts.sets)
        server.timing._before_rep(ts, r, i, draw_key(urandom))  # this call's values: a key drawn only now
        begin[(1,)](flag)
        try:
            fn(*ts.sets[r])
        except Exception as e:  # noqa: BLE001 - refused in-process: noted, the calls go on for the trace
            refusals.append(f"call {i + 1}: {type(e).__name__}: {str(e)[:300]}")
        end[(1,)](flag)
        sync()
    time.sleep(spec["settle_s"])  # work a thread of the candidate's launches late still lands in the trace
    sync()
    names = sorted(set(server.loading.kernels) | {d["name"] for d in server.loading._compiled_info()})
    return {"kernels": names, "refusals": refusals[:20], "violations": [list(v) for v in server.violations()][:20]}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    # ncu's front end keeps its temp files apart (the harness's TMPDIR for it); this process's are its own
    os.environ["TMPDIR"] = spec["tmp"]
    os.chdir(spec["tmp"])
    import tempfile

    tempfile.tempdir = None
    from gpu_worker.child.process import _redirect, apply_limits

    apply_limits(os.environ.pop("MARATHON_CHILD_LIMITS", None))
    _redirect(spec["tmp"])  # the candidate's prints go to its log, never into ncu's CSV
    try:
        out = run(spec)
    except BaseException as e:  # noqa: BLE001 - the harness reads why
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        if isinstance(getattr(e, "rule", None), str):  # the run-time guard's refusal: its rule decides
            out["rule"] = e.rule
    _write(os.path.join(spec["tmp"], "done.json"), out)
    sys.stdout.flush()
    # a normal exit, which ncu's injected library expects; a kernel an exit handler of the candidate's
    # launches now still lands in the trace, outside any call
    return 0 if "error" not in out else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
