"""The Nsight Compute proof, the harness's side: a would-be best (and a random share of the other passing
candidates) is run again in a fresh process under ncu (gpu_worker.ncu_proof_child), and the trace ncu's
front end writes, outside anything that process can write, is judged by gpu_worker.ncu_trace: every kernel
inside a call the candidate's own Triton kernel or torch's fill/copy, none of its kernels outside a call,
two markers per call, and the per-call kernel time within the cross-check's tolerance of the judged time.
Unlike the CUPTI cross-check (harness.best_checks), no figure comes from the candidate's own process."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from gpu_worker.harness.children import DeviceTurns
from gpu_worker.harness.context import StageContext
from gpu_worker.ncu_trace import (Markers, ProofVerdict, TraceError, counters_refused, find_ncu,
                                  judge_trace, ncu_command, ncu_session, parse_ncu_csv, profiling_taken, proof_due,
                                  source_kernel_names)
from gpu_worker.phases import add_phase as _add_phase
from gpu_worker.phases import phase as _phase
from gpu_worker.sandbox import (LOG_LIMIT, candidate_triton_cache, child_pythonpath, file_size, input_bank_dir,
                               tail_bytes, triton_env)
from gpu_worker.settings import CHILD_SETTINGS, work_root

PROOF_WARMUP = 1  # untimed calls first: Triton compiles (and an autotuner tries its configs) there
PROOF_REPS = 10
SETTLE_S = 1.0  # after the last call: a thread's late launch still lands in the trace
NOT_PROVEN_NO_NCU = "not proven: ncu absent (neither on PATH nor under /opt/nvidia/nsight-compute)"


@dataclass(frozen=True)
class ProofResult:
    """The proof's verdict: `ok` True (proven), False (refused: `family` names the run-time guard's rule
    when its guard refused the candidate) or None (not made here: a host's limit, which `text` says);
    `verdict`: the trace's judgement, when a trace was judged."""

    ok: bool | None
    text: str
    family: str | None = None
    verdict: ProofVerdict | None = None
    # refused where the host may be at fault: before the candidate's import (nothing of the candidate's ran),
    # or ncu's front end, outside the proof process's reach, found the GPU's profiling resources taken
    host_suspected: bool = False


class NcuProofCheck:
    """The benchmark's ncu proof (see the module's docstring)."""

    def __init__(self, ctx: StageContext, turns: DeviceTurns, renders=None):
        self.ctx, self.turns = ctx, turns
        self.renders = renders  # render_kernels.RenderKernels: a render's compiled entries, seeded into the process
        # sources whose proof was drawn and refused where the host may be at fault: the stage's retry
        # with the device to itself proves them again, whatever its own draw
        self._owed: set[str] = set()

    def proof_if_due(self, would_be_best: bool, problem, shape, source: str, dist: str, judged_ms: float, hb,
                     gpu_s: list) -> ProofResult | None:
        """The proof of `judged_ms` (the candidate's judged time a call on distribution `dist`) for a candidate
        that is due one (`proof_due`, drawn with the worker's secret generator); None when none is drawn or
        there is no CUDA. The result's `ok` is None when it could not be made here (no ncu): its text says
        so, and nothing is proven."""
        ctx = self.ctx
        if not ctx.cuda:
            return None
        key = hashlib.sha256(source.encode()).hexdigest()
        if key not in self._owed and not proof_due(would_be_best, ctx.settings.ncu_proof_share, ctx.secret.random):
            return None
        ncu = find_ncu()
        if ncu is None:
            return ProofResult(ok=None, text=NOT_PROVEN_NO_NCU)
        res = self._proof_once(ncu, problem, shape, source, dist, judged_ms, hb, gpu_s)
        if res.host_suspected:
            # ncu's profiling resources taken by another process a moment, the device's memory full beside
            # the other stages: made once more here; refused again, the stage is retried with the device to
            # itself (benchmark: HOST_SUSPECTED), where the answer stands
            _add_phase("ncu-proof.again", 1)
            res = self._proof_once(ncu, problem, shape, source, dist, judged_ms, hb, gpu_s)
        if res.host_suspected and len(self._owed) < 1024:
            self._owed.add(key)
        else:
            self._owed.discard(key)
        return res

    def _proof_once(self, ncu: str, problem, shape, source: str, dist: str, judged_ms: float, hb,
                    gpu_s: list) -> ProofResult:
        root = tempfile.mkdtemp(prefix="proof-", dir=work_root(self.ctx.settings.gpu_workdir))
        try:
            with _phase("ncu-proof"):
                return self._ncu_proof(ncu, root, problem, shape, source, dist, judged_ms, hb, gpu_s)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _ncu_proof(self, ncu: str, root: str, problem, shape, source: str, dist: str, judged_ms: float, hb,
                   gpu_s: list) -> ProofResult:
        from gpu_worker.caches import triton_cache_dir

        ctx = self.ctx
        tmp = os.path.join(root, "child")  # the only directory the proof process may write
        os.makedirs(tmp)
        if self.renders is not None:  # counted apart from the stage's children (phase_summary.render_seeds)
            _add_phase("proof.render-seed-n", self.renders.seed_source(problem, source, candidate_triton_cache(tmp))[1])
        markers = Markers.fresh(secrets.token_hex(6))
        spec = {"source": source, "problem": problem.name, "shape": shape.name, "dist": dist,
                "seed": ctx.timing_seed, "rotate": 2, "pool": 3, "warmup": PROOF_WARMUP, "reps": PROOF_REPS,
                "markers": list(markers.names()), "marker_dir": root, "tmp": tmp,
                "device": os.path.join(root, "device"), "go": os.path.join(root, "go"),
                "opened": os.path.join(root, "opened.json"),
                "wait_s": ctx.timeouts["profile"], "settle_s": SETTLE_S, "harness_pid": os.getpid(),
                "unix_sockets": ctx.settings.ncu_proof_wall == "unix",
                "trusted_roots": [str(triton_cache_dir(ctx.settings, True))]}
        spec_path = os.path.join(root, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        front = os.path.join(root, "ncu")  # ncu's own directory and temp files: out of the proof process's reach
        os.makedirs(front)
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)
        env.update(PYTHONPATH=child_pythonpath(env),
                   TMPDIR=front, TRITON_HOME=tmp, MARATHON_INPUT_BANK=str(input_bank_dir(ctx.settings.gpu_workdir)),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1", MARATHON_CHILD_LIMITS=json.dumps({"core": 0}),
                   **{CHILD_SETTINGS: ctx.settings.to_child()}, **triton_env("candidate", tmp, ctx.settings, True))
        csv_path = os.path.join(root, "ncu.csv")
        cmd = ncu_command(ncu, csv_path, [sys.executable, "-m", "gpu_worker.ncu_proof_child", spec_path])
        try:
            with open(os.path.join(root, "ncu-out.txt"), "w") as out:
                proc = subprocess.Popen(cmd, cwd=front, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:  # the host's ncu, not the candidate
            return ProofResult(ok=None, text=f"not proven: ncu ({ncu}) could not start: {e}")
        ready = loaded = None
        log = os.path.join(tmp, "log.txt")  # the proof process's stdout and stderr (gpu_worker.child.process)
        try:
            # imports first (host work); its context, timing set, markers and the candidate's load in an
            # untimed device job; the compilation outside any turn (as a child's); its calls in a timing block
            if self._proof_wait(proc, log, os.path.join(tmp, "host.json"), ctx.timeouts["load"] * 2, hb) is not None:
                with self.turns.job(), ncu_session(hb):  # the session inside the turn, as everywhere
                    open(spec["device"], "w").close()
                    loaded = self._proof_wait(proc, log, os.path.join(tmp, "loaded.json"), ctx.timeouts["load"] * 2, hb)
            if loaded is not None:
                ready = self._proof_wait(proc, log, os.path.join(tmp, "ready.json"), ctx.timeouts["compile"], hb)
            with contextlib.ExitStack() as session:
                if ready is not None:
                    # nothing else of this worker's on the device while ncu measures, nor another process
                    # under ncu until this one has ended (a kernel its exit launches is profiled too): the
                    # session outlives the turn, and waits for no turn while held
                    with self.turns.timing():
                        session.enter_context(ncu_session(hb))
                        g0 = time.monotonic()
                        open(spec["go"], "w").close()
                        self._proof_wait(proc, log, os.path.join(tmp, "done.json"), ctx.timeouts["profile"], hb)
                        gpu_s[0] += time.monotonic() - g0
                        _add_phase("ncu-proof.calls", time.monotonic() - g0)
                self._proof_wait(proc, log, None, 120, hb)  # ncu writes its CSV once the process has ended
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)
        done = _read_json(os.path.join(tmp, "done.json"))
        ncu_said = _text(os.path.join(root, "ncu-out.txt")) + "\n" + _text(csv_path)
        if counters_refused(ncu_said):
            return ProofResult(ok=None, text="not proven: ncu may not read this GPU's performance counters here "
                               "(ERR_NVGPUCTRPERM: a host setting)")
        if ready is None or not done or "error" in done:
            why = done.get("error") or (f"it ended with status {proc.returncode}" if ready is not None else "it never got ready")
            return _failed(f"the proof process did not complete its calls ({why}); ncu: {_tail(csv_path)}; "
                           f"its output: {_tail(os.path.join(root, 'ncu-out.txt'))}; process log: "
                           f"{_tail(os.path.join(tmp, 'log.txt'))}",
                           dist, family=done.get("rule"),
                           host_suspected=(profiling_taken(ncu_said) or not os.path.exists(spec["opened"]))
                           and not done.get("rule"))
        try:
            kernels = parse_ncu_csv(_text(csv_path, missing=None))
        except (OSError, TraceError) as e:
            return _failed(f"ncu's trace unreadable: {e}; ncu: {_tail(os.path.join(root, 'ncu-out.txt'))}", dist)
        v = judge_trace(kernels, markers, source_kernel_names(source), PROOF_WARMUP, PROOF_REPS, judged_ms)
        inproc = [str(x) for x in done.get("refusals") or []]
        ok, family = v.ok, v.family
        if ok and inproc:  # the trace is clean, but the guard in the proof's process refused: that decides
            ok, family = False, guard_rule(inproc[0])
        note = f"; refused in the proof process too: {' | '.join(inproc[:3])}" if inproc else ""
        return ProofResult(ok=ok, family=family, verdict=v,
                           text=f"[{dist}] {v.text()}; {len(kernels)} kernels traced by ncu in a separate "
                                f"process{note}")

    @staticmethod
    def _proof_wait(proc, log: str, path: str | None, timeout: float, hb) -> dict | None:
        """Until `path` exists (its JSON), the process ends (None, or `path`'s JSON if it was written) or
        `timeout` passes (None). A process whose `log` outgrows a sandbox's limit is killed (None)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if hb:
                hb()
            if file_size(log) > LOG_LIMIT:
                os.killpg(proc.pid, 9)
                return None
            if path and os.path.exists(path):
                return _read_json(path)
            if proc.poll() is not None:
                return _read_json(path) if path and os.path.exists(path) else None
            time.sleep(0.02)
        return None


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _text(path: str, missing: str | None = "") -> str:
    """A file's text; `missing` where it cannot be read (None: the OSError is raised)."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        if missing is None:
            raise
        return missing


def _tail(path: str, n: int = 600) -> str:
    data = tail_bytes(path, n)
    return "(none)" if data is None else data.decode(errors="replace").replace("\n", " | ")


def guard_rule(refusal: str) -> str | None:
    """The rule a run-time guard's refusal line names (`... [lazy-output] ...`), or None."""
    m = re.search(r"\[([a-z][a-z-]*)\]", refusal)
    return m.group(1) if m else None


def _failed(why: str, dist: str, family: str | None = None, host_suspected: bool = False) -> ProofResult:
    """A refused proof; `family`: the rule of the run-time guard that refused the candidate in the proof's
    process, which names the refusal as it would in a candidate child; `host_suspected`: see ProofResult."""
    return ProofResult(ok=False, family=family, text=f"[{dist}] REFUSED: not proven: {why}",
                       host_suspected=host_suspected)
