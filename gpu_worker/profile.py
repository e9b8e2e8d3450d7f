"""Profile activity: a short text the proposer can act on.

On CUDA with Nsight Compute available, the candidate runs once more in a fresh sandbox child under
`ncu --clock-control none` with a small section set (SpeedOfLight, Occupancy, LaunchStats) restricted to
the candidate's kernels; the summary gives the bound (memory/compute/latency), memory and SM throughput
as % of peak, achieved occupancy, registers. Otherwise (no ncu, ncu refused, or the interpreter) it falls
back to the compile report plus torch.profiler kernel time and a roofline against the measured ceilings.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import time

from workflows.contracts import EvalRequest, ProfileReport


def _parse_ncu_csv(text: str) -> list[dict]:
    start = text.find('"ID"')
    if start < 0:
        return []
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    kernels: dict[str, dict] = {}
    for r in rows:
        name = r.get("Kernel Name", "?")
        k = kernels.setdefault(name, {})
        metric = r.get("Metric Name", "")
        val = (r.get("Metric Value") or "").replace(",", "")
        try:
            k[metric] = float(val)
        except ValueError:
            k[metric] = val
        k[metric + "_unit"] = r.get("Metric Unit", "")
    return [{"kernel": n, **m} for n, m in kernels.items()]


def _ncu(ev, req: EvalRequest, source: str, kernels: list[str], hb) -> tuple[str, str, str | None]:
    """Run the candidate under ncu in a fresh sandboxed process (gpu_worker.oneshot)."""
    from gpu_worker.caches import triton_cache_dir
    from gpu_worker.settings import work_root

    from gpu_worker.ncu_trace import find_ncu
    from gpu_worker.sandbox import candidate_triton_cache, child_pythonpath

    exe = find_ncu()
    if not exe or not kernels:
        return "", "unknown", "ncu not found" if not exe else "no kernels to profile"
    import tempfile

    workdir = ev.settings.gpu_workdir
    tmp = tempfile.mkdtemp(prefix="ncu-", dir=work_root(workdir))
    try:
        job = os.path.join(tmp, "candidate.py")
        with open(job, "w") as f:
            f.write(source)
        if ev.children.renders is not None:  # a render's kernels, compiled by its earlier children
            ev.children.renders.seed_source(ev.ctx.problem(req.problem), source, candidate_triton_cache(tmp))
        regex = "regex:^(" + "|".join(kernels) + ")"
        cmd = [exe, "--clock-control", "none", "--section", "SpeedOfLight", "--section", "Occupancy",
               "--section", "LaunchStats", "--csv", "--page", "details", "-k", regex, "-c", "4",
               sys.executable, "-m", "gpu_worker.oneshot", job, req.problem, req.shape or "", tmp]
        env = dict(os.environ, TRITON_CACHE_DIR=str(triton_cache_dir(ev.settings, ev.cuda)), TMPDIR=tmp,
                   TRITON_HOME=tmp)
        env["PYTHONPATH"] = child_pythonpath(env)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp, env=env,
                             start_new_session=True)
        deadline = time.monotonic() + 300
        while p.poll() is None:
            if hb:
                hb()
            if time.monotonic() > deadline:
                os.killpg(p.pid, 9)
                return "", "unknown", "ncu timed out"
            time.sleep(0.5)
        out = p.stdout.read()
        rows = _parse_ncu_csv(out)
        if not rows:
            return out[-3000:], "unknown", f"ncu produced no metrics (status {p.returncode}): {_ncu_said(out)}"
        lines, bound = [], "unknown"
        for r in rows:
            mem = r.get("Memory Throughput")
            sm = r.get("Compute (SM) Throughput")
            occ = r.get("Achieved Occupancy")
            regs = r.get("Registers Per Thread")
            dur = r.get("Duration")
            dur_u = r.get("Duration_unit", "")
            if isinstance(mem, float) and isinstance(sm, float):
                b = "memory" if mem >= sm else "compute"
                if max(mem, sm) < 40:
                    b = "latency"
                bound = b if bound == "unknown" else bound
            else:
                b = "unknown"
            lines.append(f"{r['kernel'][:60]}: {dur} {dur_u}, memory {mem}% of peak, SM {sm}% of peak, "
                         f"achieved occupancy {occ}%, {regs} regs/thread -> {b}-bound")
        return "\n".join(lines), bound, None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ncu_said(out: str, n: int = 400) -> str:
    """What ncu reported of its failure, one line: its error and warning lines, and where the profiled process
    itself failed, that process's last lines (its traceback's end); else the end of the output."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    notes = [ln for ln in lines if ln.startswith(("==ERROR==", "==WARNING=="))]
    if not notes:
        return (" | ".join(lines[-5:]) or "no output")[-n:]
    text = " | ".join(notes)
    if any("application returned an error code" in ln for ln in notes):
        app = [ln for ln in lines if not ln.startswith("==")]
        text += " | the profiled process said: " + (" | ".join(app[-3:]) or "nothing")
    return text[-n:]


def profile_candidate(ev, req: EvalRequest, hb=None) -> ProfileReport:
    from gpu_worker import protocol as msg
    from gpu_worker.sandbox import Rejection, SandboxFailure

    source = ev.ctx.source(req.source_key)
    comp = ev.compile(req, hb)
    if not comp.ok:
        return ProfileReport(ok=False, summary=f"does not compile: {comp.error[:500]}", tool="compile",
                             report_key=comp.log_key)
    parts = []
    if comp.registers is not None:
        parts.append(f"compile: {', '.join(comp.kernels)}; registers {comp.registers}, spills {comp.spills}, "
                     f"shared {comp.shared_bytes} B, num_warps {comp.num_warps}, num_stages {comp.num_stages}, "
                     f"tensor cores {comp.tensor_cores}, TMA {comp.tma}")
    tool, bound = "compile+torch.profiler", "unknown"
    if ev.cuda:
        from gpu_worker.ncu_trace import ncu_session

        with ev.turns.timing(), ncu_session(hb):  # inside the turn: a holder of the session waits for none
            text, b, err = _ncu(ev, req, source, comp.kernels, hb)
        if err is None:
            tool, bound = "ncu", b
            parts.append(text)
        else:
            parts.append(f"(ncu unavailable: {err})")
    try:
        problem = ev.ctx.problem(req.problem)
        shape = ev.ctx.shape(problem, req.shape)
        # the child compile left loaded (else a fresh one), loaded and fed before the timing block: loading
        # takes untimed device jobs, which cannot be had inside a timing block
        key = ev.ctx.child_key(req.problem, shape, req.source_key)
        sb, _ = ev.children.loaded_child(key, source, problem, shape, hb)
        dist = problem.distributions[0]
        with sb:
            with ev.turns.job():
                ev.children.ask(sb, ev.ctx.timing_set_request(dist), ev.timeouts["load"], "profile", hb)
            with ev.turns.timing():
                # device time, back to back (a profile is one side: no comparison to keep in one mode)
                t = ev.children.ask(sb, msg.Time(reps=10 if ev.cuda else 1, warmup=2 if ev.cuda else 1,
                                                 mode="back-to-back", dist=dist), ev.timeouts["time"], "profile", hb)
                p = ev.children.ask(sb, msg.Profile(reps=5 if ev.cuda else 1, dist=dist), ev.timeouts["profile"],
                                    "profile", hb)
        from gpu_worker.timing import median

        t_ms = median(t.times)
        if ev.cuda:
            ceil = ev.ensure_ceilings(problem, shape, hb)
            bw = problem.bytes_moved(shape) / (t_ms / 1e3)
            fl = problem.flops(shape) / (t_ms / 1e3)
            fb, ff = bw / ceil.bandwidth, fl / ceil.flops
            if bound == "unknown":
                bound = "memory" if fb >= ff else "compute"
                if max(fb, ff) < 0.3:
                    bound = "latency"
            top = sorted(p.kernels.items(), key=lambda kv: -kv[1])[:4]
            parts.append(f"time {t_ms:.4g} ms; achieved {bw / 1e12:.2f} TB/s ({100 * fb:.0f}% of measured "
                         f"{ceil.bandwidth / 1e12:.2f}), {fl / 1e12:.1f} TFLOP/s ({100 * ff:.1f}% of measured "
                         f"{ceil.flops / 1e12:.0f}); floor {problem.floor_ms(shape, ceil.bandwidth, ceil.flops):.4g} ms")
            parts.append("kernels (ms/call): " + ", ".join(f"{k[:40]} {v:.4g}" for k, v in top))
        else:
            parts.append(f"interpreter run {t_ms:.1f} ms (not a speed measure); no hardware counters on CPU")
    except Rejection as rej:
        return ProfileReport(ok=False, summary=f"{rej.stage}: {rej.reason[:500]}", tool=tool)
    except SandboxFailure as f:
        return ProfileReport(ok=False, summary=f"sandbox {f.kind}: {f.reason}", tool=tool)
    summary = "\n".join(parts)
    if bound != "unknown":
        summary = f"{bound}-bound. " + summary
    return ProfileReport(ok=True, summary=summary[:3000], bound=bound, tool=tool, report_key=ev.ctx.log(summary))
