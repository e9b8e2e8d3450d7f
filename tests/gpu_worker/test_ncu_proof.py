"""The ncu proof's harness side on the CPU: the wall its process gets with `MARATHON_NCU_PROOF_WALL=unix`
(AF_UNIX sockets only), the marker kernels' source, the plain "not proven" where ncu is absent, and the
interpreter's path, which makes no proof. The proof itself runs on a GPU: tests/gpu_worker/test_ncu_proof_gpu.py."""

from __future__ import annotations

import ast
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_worker import wall
from gpu_worker.harness import ncu_proof
from gpu_worker.harness.ncu_proof import NOT_PROVEN_NO_NCU, NcuProofCheck, ProofResult
from gpu_worker.ncu_proof_child import marker_source
from gpu_worker.ncu_trace import Markers
from gpu_worker.settings import GpuWorkerSettings, SettingsError

REPO = Path(__file__).resolve().parents[2]

UNIX_PROBE = r'''
import json, socket, sys
from gpu_worker import wall
desc = wall.install([sys.argv[1]], unix_sockets=sys.argv[2] == "1")
res = {"sockets": desc.get("sockets", "")}
for name, family in (("unix", socket.AF_UNIX), ("tcp", socket.AF_INET), ("ipv6", socket.AF_INET6)):
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        res[name] = "ok"
    except OSError as e:
        res[name] = f"refused errno {e.errno}"
print(json.dumps(res))
'''


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
@pytest.mark.parametrize("unix", [True, False])
def test_the_proof_walls_unix_variant_allows_only_af_unix_sockets(tmp_path, unix):
    out = subprocess.run([sys.executable, "-c", UNIX_PROBE, str(tmp_path), "1" if unix else "0"], capture_output=True,
                         text=True, timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["tcp"].startswith("refused") and res["ipv6"].startswith("refused")
    assert res["unix"] == ("ok" if unix else "refused errno 13")
    assert bool(res["sockets"]) is unix


def test_the_seccomp_programs_differ_only_where_sockets_are_decided():
    plain = wall.seccomp_program(allow_exec=True, deny_writes=False, arch=wall._ARCH["x86_64"])
    unix = wall.seccomp_program(allow_exec=True, deny_writes=False, arch=wall._ARCH["x86_64"], unix_sockets=True)
    assert len(unix) == len(plain) + 2 * 8  # the load of socket()'s family and its test, and nothing else


def test_the_marker_source_defines_three_triton_kernels_under_the_fresh_names():
    m = Markers.fresh("0123456789ab")
    tree = ast.parse(marker_source(m.names()))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [d.name for d in defs] == list(m.names())
    assert all(ast.unparse(d.decorator_list[0]) == "triton.jit" for d in defs)


def _plumbing(tmp_path: Path, cuda: bool = True, share: float = 0.0) -> NcuProofCheck:
    """The harness's side alone, its device turns a serial caller's (none to wait for): `cuda` as on a device."""
    from gpu_worker.harness.children import DeviceTurns
    from gpu_worker.harness.context import StageContext
    from gpu_worker.harness.serial import SerialScheduler
    from workflows.artifacts import ArtifactStore

    sched = SerialScheduler()
    settings = GpuWorkerSettings(gpu_workdir=tmp_path / "work", cache_dir=tmp_path / "cache", ncu_proof_share=share)
    ctx = StageContext(store=ArtifactStore(tmp_path / "art"), settings=settings, cuda=cuda, interpreter=not cuda,
                       sched=sched, owner=sched.owner, loaded=sched.loaded,
                       timeouts={"load": 120, "compile": 120, "profile": 120}, timing_seed=1000,
                       secret=random.Random(5))
    return NcuProofCheck(ctx, DeviceTurns(ctx))


def test_without_ncu_a_would_be_best_is_plainly_not_proven(monkeypatch, tmp_path):
    monkeypatch.setattr(ncu_proof, "find_ncu", lambda: None)
    r = _plumbing(tmp_path).proof_if_due(True, None, None, "", "normal", 0.02, None, [0.0])
    assert r == ProofResult(ok=None, text=NOT_PROVEN_NO_NCU)
    assert r.text.startswith("not proven: ncu absent")


def test_a_candidate_not_drawn_and_the_interpreter_get_no_proof(monkeypatch, tmp_path):
    monkeypatch.setattr(ncu_proof, "find_ncu", lambda: pytest.fail("no proof was due"))
    assert _plumbing(tmp_path, cuda=True, share=0.0).proof_if_due(False, None, None, "", "normal", 0.02, None, [0.0]) is None
    assert _plumbing(tmp_path, cuda=False, share=1.0).proof_if_due(True, None, None, "", "normal", 0.02, None, [0.0]) is None


def test_the_proof_settings_parse_and_refuse_bad_values():
    s = GpuWorkerSettings.from_env({"MARATHON_NCU_PROOF_SHARE": "0.25", "MARATHON_NCU_PROOF_WALL": "UNIX"})
    assert s.ncu_proof_share == 0.25 and s.ncu_proof_wall == "unix"
    assert GpuWorkerSettings().ncu_proof_share == 0.1 and GpuWorkerSettings().ncu_proof_wall == "on"
    with pytest.raises(SettingsError, match="MARATHON_NCU_PROOF_SHARE='2'"):
        GpuWorkerSettings.from_env({"MARATHON_NCU_PROOF_SHARE": "2"})
    with pytest.raises(SettingsError, match="MARATHON_NCU_PROOF_WALL"):
        GpuWorkerSettings.from_env({"MARATHON_NCU_PROOF_WALL": "tcp"})


# a candidate whose every call leaves a thread of its own running: alive long past the call however slowly
# the interpreter runs it on a loaded host, and a daemon, so that the process still exits at once
LATE_THREAD = ("import threading\n\n\ndef run(inputs, out):\n"
               "    threading.Thread(target=__import__('time').sleep, args=(60,), daemon=True).start()")


def _proof_files(tmp_path: Path, source: str, dist: str, **spec) -> tuple[Path, Path, list[str], dict]:
    """The proof process's directories, spec and command, and its environment under the Triton interpreter
    (no ncu): `spec` entries replace the defaults."""
    root, tmp = tmp_path / "proof", tmp_path / "proof" / "child"
    tmp.mkdir(parents=True)
    spec = {"source": source, "problem": "softmax", "shape": None, "dist": dist, "seed": 1000, "rotate": 2,
            "pool": 3, "warmup": 1, "reps": 2, "markers": list(Markers.fresh("cpu0test").names()),
            "marker_dir": str(root), "tmp": str(tmp), "go": str(root / "go"), "device": str(root / "device"),
            "opened": str(root / "opened.json"),
            "wait_s": 5, "settle_s": 0.3, "unix_sockets": False, "trusted_roots": [], **spec}
    (root / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1", "TMPDIR": str(tmp), "TRITON_HOME": str(tmp),
           "TRITON_CACHE_DIR": str(tmp / "triton-cache")}
    env.pop("MARATHON_INPUT_BANK", None)
    return root, tmp, [sys.executable, "-m", "gpu_worker.ncu_proof_child", str(root / "spec.json")], env


def _run_child(tmp_path: Path, source: str, dist: str) -> dict:
    """The proof process's script run directly (no ncu) under the Triton interpreter: the same load behind
    the guard and the wall, the rehearsal, the markers and the bracketed calls as on a GPU."""
    root, tmp, cmd, env = _proof_files(tmp_path, source, dist)
    (root / "go").write_text("")
    (root / "device").write_text("")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp, env=env)
    log = (tmp / "log.txt").read_text() if (tmp / "log.txt").exists() else ""
    assert (tmp / "ready.json").exists(), log[-3000:]
    return {"rc": out.returncode, "done": json.loads((tmp / "done.json").read_text()),
            "ready": json.loads((tmp / "ready.json").read_text()), "log": log}


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_the_proof_process_loads_behind_the_wall_and_brackets_each_call(tmp_path):
    from baselines.registry import get_problem
    from gpu_worker.canaries import canary_source

    dist = get_problem("softmax").distributions[0]
    late = _run_child(tmp_path / "late", canary_source("fast").replace("def run(inputs, out):", LATE_THREAD), dist)
    assert late["rc"] == 0, late["log"][-3000:]
    assert late["ready"]["wall"]["os"] == "on" and "sockets" not in late["ready"]["wall"]
    assert late["done"]["kernels"] == ["canary_fast_softmax"]
    # refused in the process (which refuses the proof), and every call still ran for the trace
    refusals = late["done"]["refusals"]
    assert refusals and all("thread" in r for r in refusals) and refusals[-1].startswith("call 3: ")


@pytest.mark.parametrize("wait", ["device", "go"])
def test_a_proof_whose_harness_ended_stops_waiting(tmp_path, wait):
    """A worker killed while its proof waits, for a device turn (before the OS wall) or for its start
    (behind it), leaves no proof process holding on for the whole wait: the process sees the worker gone
    (ESRCH) and ends, saying so; while the worker lives, it waits on."""
    from gpu_worker.canaries import canary_source

    if wait == "go" and (wall._arch() is None or not sys.platform.startswith("linux")):
        pytest.skip("the OS wall needs Linux")
    waiting, error = {"device": ("host.json", "no device turn"), "go": ("ready.json", "no go signal")}[wait]
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    root, tmp, cmd, env = _proof_files(tmp_path, canary_source("fast"), "normal", wait_s=300, harness_pid=worker.pid)
    if wait == "go":
        (root / "device").write_text("")
    proof = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (tmp / waiting).exists() and proof.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        log = tmp / "log.txt"
        assert (tmp / waiting).exists(), log.read_text()[-2000:] if log.exists() else ""
        time.sleep(1.5)  # the worker's liveness is checked about every half second meanwhile
        assert proof.poll() is None  # still waiting while the worker lives
        worker.kill()
        worker.wait()
        t0 = time.monotonic()
        assert proof.wait(30) == 3
        assert time.monotonic() - t0 < 10
        assert json.loads((tmp / "done.json").read_text()) == {"error": f"{error} (the harness ended)"}
    finally:
        for p in (worker, proof):
            if p.poll() is None:
                p.kill()
                p.wait()


# A stand-in for ncu's front end, for the harness's plumbing on a host without a GPU: it runs the target
# (under the Triton interpreter) and, once it has ended, writes the CSV an honest run would leave: the
# trusted prelude, OPEN, and per call a flush, BEGIN, the candidate's kernels as the process reported them
# (`KERNEL_NS` each), END. It reads the markers from the spec the harness wrote, as no candidate could ahead.
STAND_IN = r'''#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
target = args[args.index("--log-file") + 2:]
mode = os.environ.get("STAND_IN_MODE", "honest")
if os.environ.get("STAND_IN_RUNS"):  # one line a run
    open(os.environ["STAND_IN_RUNS"], "a").write("run\n")
if mode == "busy-once":  # the first run finds the GPU's profiling resources taken, as ncu says it then
    mode = "busy" if not os.path.exists(os.environ["STAND_IN_RUNS"] + ".busy") else "honest"
    open(os.environ["STAND_IN_RUNS"] + ".busy", "a").close()
if mode == "busy":
    open(log, "w").write("==ERROR== Profiling failed because a driver resource was unavailable.\n")
    sys.exit(9)
if mode == "no-counters":
    open(log, "w").write("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                         "Performance Counters on the target device 0.\n")
if mode == "no-launch":
    open(log, "w").write("==ERROR== Failed to launch the target application.\n")
if mode != "honest":
    sys.exit(1)
rc = subprocess.run(target, env={{**os.environ, "TRITON_INTERPRET": "1"}}).returncode
spec = json.load(open(target[-1]))
done = json.load(open(os.path.join(spec["tmp"], "done.json")))
opn, begin, end = spec["markers"]
flush = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(T3)"
rows = [(flush, 30000), (begin, 1000), (end, 1000), (opn, 1000)]
for i in range(spec["warmup"] + spec["reps"]):
    rows += [(flush, 30000), (begin, 1000)] + [(k, {kernel_ns}) for k in done["kernels"]] + [(end, 1000)]
with open(log, "w") as f:
    f.write('"ID","Process ID","Process Name","Host Name","Kernel Name","Metric Name","Metric Unit","Metric Value"\n')
    for n, (name, ns) in enumerate(rows):
        f.write(f'"{{n}}","4242","python","host","{{name}}","gpu__time_duration.sum","nsecond","{{ns:,}}"\n')
sys.exit(rc)
'''


def _stand_in(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """The stand-in written and found as ncu; returns it and the file it adds a line to at each run."""
    stand_in, runs = tmp_path / "ncu", tmp_path / "runs"
    stand_in.write_text(STAND_IN.format(python=sys.executable, kernel_ns=20000))
    stand_in.chmod(0o755)
    monkeypatch.setattr(ncu_proof, "find_ncu", lambda: str(stand_in))
    monkeypatch.setenv("STAND_IN_RUNS", str(runs))
    return stand_in, runs


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_the_harness_runs_the_proof_process_under_the_front_end_and_judges_its_trace(tmp_path, monkeypatch):
    """Proven, after a first try that found the device's profiling resources taken before the candidate
    existed (the host's fault: made once more); then the host's other limits, said so."""
    from baselines.registry import get_problem
    from gpu_worker.canaries import canary_source

    stand_in, runs = _stand_in(tmp_path, monkeypatch)
    monkeypatch.setenv("STAND_IN_MODE", "busy-once")
    p = get_problem("softmax")
    h, dist = _plumbing(tmp_path), p.distributions[0]
    r = h.proof_if_due(True, p, p.cpu_shape, canary_source("fast"), dist, 0.02, None, [0.0])
    assert r.ok is True, r.text
    assert len(runs.read_text().splitlines()) == 2
    assert r.verdict.seen == ["canary_fast_softmax"] and r.verdict.calls == 11
    assert r.text.startswith(f"[{dist}] proven: ncu kernel time 0.02 ms/call vs judged 0.02 ms")
    assert not list((tmp_path / "work").glob("proof-*"))  # nothing of the proof is left behind
    monkeypatch.setenv("STAND_IN_MODE", "no-counters")
    r = h.proof_if_due(True, p, p.cpu_shape, canary_source("fast"), dist, 0.02, None, [0.0])
    assert r.ok is None and r.text.startswith("not proven: ncu may not read")
    stand_in.chmod(0o644)  # an ncu that cannot run: the host's fault, said so
    r = h.proof_if_due(True, p, p.cpu_shape, canary_source("fast"), dist, 0.02, None, [0.0])
    assert r.ok is None and r.text.startswith(f"not proven: ncu ({stand_in}) could not start")
    stand_in.chmod(0o755)
    monkeypatch.setenv("STAND_IN_MODE", "no-launch")
    r = h.proof_if_due(True, p, p.cpu_shape, canary_source("fast"), dist, 0.02, None, [0.0])
    assert r.ok is False and "not proven: the proof process did not complete its calls (it never got ready)" in r.text
    assert "ncu: ==ERROR== Failed to launch the target application." in r.text  # ncu's own log says why


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_a_proof_that_failed_once_the_candidate_existed_is_not_made_again(tmp_path, monkeypatch):
    """Made once more only where the proof failed before the candidate's import: the profiling resources
    taken twice refuse it (ncu's line in the reason); a candidate failing at its import, which first tries
    to unmake the sign that it existed, is refused at once (its wall keeps the sign)."""
    from baselines.registry import get_problem

    _, runs = _stand_in(tmp_path, monkeypatch)
    p = get_problem("softmax")
    h, dist = _plumbing(tmp_path), p.distributions[0]

    def prove(mode: str, source: str) -> tuple[ProofResult, int]:
        runs.unlink(missing_ok=True)
        monkeypatch.setenv("STAND_IN_MODE", mode)
        r = h.proof_if_due(True, p, p.cpu_shape, source, dist, 0.02, None, [0.0])
        return r, len(runs.read_text().splitlines())

    r, n = prove("busy", "")
    assert r.ok is False and n == 2 and "driver resource was unavailable" in r.text, r.text
    assert r.host_suspected  # the benchmark's stage then runs once more with the device to itself
    unmake = (f"import glob, os\nfor f in glob.glob({str(tmp_path / 'work')!r} + '/**/opened*', recursive=True):\n"
              "    try:\n        os.remove(f)\n    except OSError:\n        pass\nraise ImportError('no')\n")
    r, n = prove("honest", unmake)
    assert r.ok is False and n == 1 and not r.host_suspected, r.text
    assert "ImportError: no" in r.text


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_a_proof_refused_where_the_host_may_be_at_fault_is_owed_to_the_stages_retry(tmp_path, monkeypatch):
    """A candidate drawn for a proof (the random share, not a would-be best) whose proof the host may have
    failed twice is proven at the stage's retry with the device to itself whatever that retry draws, so
    that failing its proof never lets a candidate out of it; once answered, the debt is gone."""
    from baselines.registry import get_problem
    from gpu_worker.canaries import canary_source

    _, runs = _stand_in(tmp_path, monkeypatch)
    p = get_problem("softmax")
    h, dist = _plumbing(tmp_path, share=1.0), p.distributions[0]
    source = canary_source("fast")
    monkeypatch.setenv("STAND_IN_MODE", "busy")
    r = h.proof_if_due(False, p, p.cpu_shape, source, dist, 0.02, None, [0.0])
    assert r.ok is False and r.host_suspected
    h.ctx.settings = h.ctx.settings.model_copy(update={"ncu_proof_share": 0.0})  # the retry would draw none
    assert h.proof_if_due(False, p, p.cpu_shape, source + "\n", dist, 0.02, None, [0.0]) is None  # another source
    monkeypatch.setenv("STAND_IN_MODE", "honest")
    r = h.proof_if_due(False, p, p.cpu_shape, source, dist, 0.02, None, [0.0])
    assert r is not None and r.ok is True, r and r.text
    assert h.proof_if_due(False, p, p.cpu_shape, source, dist, 0.02, None, [0.0]) is None  # nothing owed now


@pytest.mark.slow(20)
@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_two_proofs_at_once_take_turns_under_ncu(tmp_path, monkeypatch):
    """Two would-be bests' proofs asked for together: each process under ncu launches kernels only while
    it holds the worker's ncu session (its device job, then its calls until it has ended), never two at
    once (on a GPU another session's kernels fail then: 'a driver resource was unavailable'); both proven."""
    import contextlib
    import threading

    from baselines.registry import get_problem
    from gpu_worker.canaries import canary_source

    _stand_in(tmp_path, monkeypatch)
    held, seen, lock = [], [], threading.Lock()
    real = ncu_proof.ncu_session

    @contextlib.contextmanager
    def counted(hb=None):
        with real(hb):
            with lock:
                held.append(threading.current_thread().name)
                seen.append(len(held))
            try:
                yield
            finally:
                with lock:
                    held.remove(threading.current_thread().name)

    monkeypatch.setattr(ncu_proof, "ncu_session", counted)
    p = get_problem("softmax")
    h, dist = _plumbing(tmp_path), p.distributions[0]
    results = []

    def prove():
        results.append(h.proof_if_due(True, p, p.cpu_shape, canary_source("fast"), dist, 0.02, None, [0.0]))

    threads = [threading.Thread(target=prove, name=f"proof-{i}") for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [r.ok for r in results] == [True, True], [r.text for r in results]
    assert seen == [1, 1, 1, 1], seen  # two holds a proof (its device job, its calls), one at a time


def test_a_guard_refusal_names_its_rule():
    assert ncu_proof.guard_rule("call 2: GuardViolation: [lazy-output] the candidate left 1 thread(s)") == "lazy-output"
    assert ncu_proof.guard_rule("compile: [escape] sys._getframe") == "escape"
    assert ncu_proof.guard_rule("call 1: RuntimeError: boom") is None


@pytest.mark.skipif(wall._arch() is None or not sys.platform.startswith("linux"), reason="the OS wall needs Linux")
def test_a_clean_trace_does_not_prove_a_candidate_the_guard_refused_in_the_proof_process(tmp_path, monkeypatch):
    from baselines.registry import get_problem
    from gpu_worker.canaries import canary_source

    _stand_in(tmp_path, monkeypatch)
    p = get_problem("softmax")
    late = canary_source("fast").replace("def run(inputs, out):", LATE_THREAD)
    r = _plumbing(tmp_path).proof_if_due(True, p, p.cpu_shape, late, p.distributions[0], 0.02, None,
                                          [0.0])
    assert r.verdict.ok is True  # the stand-in's trace holds the calls' kernels alone
    assert r.ok is False and r.family == "lazy-output", r.text
    assert "refused in the proof process too" in r.text
