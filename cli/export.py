"""`marathon export` and `marathon verify`.

export: a run's crowned best kernel as a standalone file, `kernel.py`, with a receipt beside it
(`receipt.json`, `receipt.md`) and, for a problem file or folder, the problem itself (`problem.py`,
`problem/`), so that the receipt's re-verify command works on any machine with the project installed:

  built-in and folder problems   the candidate module as the harness judged it: `run(inputs, out)`
  problem files                  the same, then (below EXPORT_MARKER) `ModelNew`, the file's Model with its
                                 forward done by `run`: same constructor, parameters, forward arguments and
                                 outputs, so it drops in where the Model is used

verify: the harness's verification of a kernel file against a problem on this machine (GPU where CUDA is
available, else the Triton interpreter on the problem's CPU inputs), in a temporary artifact store.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shlex
import tempfile
from pathlib import Path

from workflows.artifacts import ArtifactStore, ArtifactStoreError, default_root
from activities.ledger import read_ledger


class ExportError(Exception):
    """Bad input for export or verify: one line."""


# ---- the problem a run names -------------------------------------------------------------------------------
def problem_source(problem: str, store: ArtifactStore) -> dict:
    """What the problem's key and content are: {"key", "kind", "sha256", "files"} (files: name -> bytes,
    the problem's own sources)."""
    from baselines.external.file import is_file_key
    from baselines.external.folder import folder_manifest, is_folder_key

    if is_file_key(problem):
        digest = problem.removeprefix("file:")
        data = store.get_bytes(digest)
        return {"key": problem, "kind": "file", "sha256": digest, "files": {"problem.py": data}}
    if is_folder_key(problem):
        manifest = store.get_json(problem.removeprefix("folder:"))
        files = {n: store.get_bytes(k) for n, k in manifest["files"].items()}
        return {"key": problem, "kind": "folder", "sha256": problem.removeprefix("folder:"), "files": files}
    root = Path(__file__).resolve().parents[1] / "baselines" / problem
    files = {f.name: f.read_bytes() for f in sorted(root.glob("*.py"))}
    key, _ = folder_manifest(files)  # the same content key a folder of these files would have
    return {"key": problem, "kind": "built-in", "sha256": key.removeprefix("folder:"), "files": files}


def _receipt_fields(store: ArtifactStore, log_key: str | None) -> dict:
    """The `receipt: {...}` line of the accepted measurement's benchmark log (device, versions, mode)."""
    if not log_key or not store.exists(log_key):
        return {}
    for line in store.get_text(log_key).splitlines():
        if line.startswith("receipt: "):
            try:
                value = ast.literal_eval(line.removeprefix("receipt: "))
            except (ValueError, SyntaxError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


# ---- export ------------------------------------------------------------------------------------------------
def kernel_file_text(wid: str, st, source: str, prob: dict, verify_cmd: str) -> str:
    """kernel.py: a header of comments (a docstring could displace a `from __future__` import), the
    candidate as judged, and for a problem file the ModelNew form."""
    from baselines.external.model_new import EXPORT_MARKER

    head = [f"# Exported from marathon run {wid}: the best kernel of problem {prob['key']}",
            f"# (candidate {st.best.candidate_id}, iteration {st.best.iteration}); receipt.json beside it.",
            f"# Re-verify against the problem's reference: {verify_cmd}"]
    if prob["kind"] == "file":
        head.append("# Call it as the problem's Model: ModelNew(*get_init_inputs())(*get_inputs()), or "
                    "run(inputs, out) directly.")
    else:
        head.append("# Call it as the harness does: run(inputs, out), with the problem's named inputs and "
                    "preallocated outputs.")
    text = "\n".join(head) + "\n\n" + source.rstrip("\n") + "\n"
    if prob["kind"] != "file":
        return text
    ref = prob["files"]["problem.py"].decode()
    return text + f'''

{EXPORT_MARKER}
import torch as marathon_torch
import types as marathon_types

#: the problem file (sha256 {prob["sha256"]}); its Model gives ModelNew its constructor and parameters
MARATHON_REFERENCE_SOURCE = {ref!r}
marathon_reference = marathon_types.ModuleType("marathon_reference_{prob["sha256"][:16]}")
exec(compile(MARATHON_REFERENCE_SOURCE, "problem.py", "exec"), marathon_reference.__dict__)


class ModelNew(marathon_reference.Model):
    """The problem's Model with forward done by run(inputs, out): the same constructor, parameters and
    buffers (by name, so Model's state_dict loads), forward arguments and outputs."""

    def forward(self, *args):
        if getattr(self, "marathon_reference_call", False):
            return super().forward(*args)
        sizes = tuple((tuple(a.shape), a.dtype) for a in args)
        specs = self.__dict__.setdefault("marathon_output_specs", {{}})
        if sizes not in specs:
            specs[sizes] = self.marathon_outputs(args)
        inputs = {{f"in{{i}}": a.contiguous() for i, a in enumerate(args)}}
        inputs.update({{n: t.detach().contiguous() for n, t in self.named_parameters()}})
        inputs.update({{n: t.detach().contiguous() for n, t in self.named_buffers()}})
        device = args[0].device if args else next(iter(inputs.values())).device
        out = {{f"out{{i}}": marathon_torch.empty(shape, dtype=dtype, device=device)
               for i, (shape, dtype) in enumerate(specs[sizes][1])}}
        with marathon_torch.no_grad():
            run(inputs, out)
        outs = tuple(out.values())
        return outs[0] if specs[sizes][0] else outs

    def marathon_outputs(self, args):
        """(single tensor?, [(shape, dtype)]) of the reference's outputs: on the meta device, else for real."""
        state = {{n: t.detach() for n, t in list(self.named_parameters()) + list(self.named_buffers())}}
        self.marathon_reference_call = True
        try:
            with marathon_torch.no_grad():
                try:
                    res = marathon_torch.func.functional_call(
                        self, {{n: t.to("meta") for n, t in state.items()}}, tuple(a.to("meta") for a in args))
                except Exception:  # an op without a meta kernel: run the reference once
                    res = marathon_torch.func.functional_call(self, state, tuple(args))
        finally:
            self.marathon_reference_call = False
        single = isinstance(res, marathon_torch.Tensor)
        return single, [(tuple(t.shape), t.dtype) for t in ((res,) if single else res)]
'''


def receipt_of(wid: str, st, store: ArtifactStore, source: str, key: str, prob: dict, verify_cmd: str) -> dict:
    rec = next((r for r in reversed(read_ledger(store, st.ledger_key))
                if r.candidate_id == st.best.candidate_id and r.log_key), None) if st.ledger_key else None
    fields = _receipt_fields(store, rec.log_key if rec else None)
    b = st.best
    return {
        "run_id": wid,
        "problem": {"key": prob["key"], "kind": prob["kind"], "source_sha256": prob["sha256"]},
        "kernel": {"candidate_id": b.candidate_id, "iteration": b.iteration, "source_key": key,
                   "source_sha256": hashlib.sha256(source.encode()).hexdigest()},
        "best": {"speedup": None if b.interpreter else b.speedup, "time_ms": b.time_ms,
                 "baseline_ms": b.baseline_ms, "interpreter": b.interpreter,
                 "speedup_ci": list(rec.speedup_ci) if rec and rec.speedup_ci else None,
                 "deciding_distribution": rec.deciding_dist if rec else None,
                 "rel_err": rec.rel_err if rec else None},
        "measured_on": {k: fields.get(k, "") for k in ("device", "driver", "clocks", "torch", "triton", "mode",
                                                        "repetitions", "spread", "baseline_env")}
        if fields else None,
        "verify_command": verify_cmd,
    }


def receipt_markdown(r: dict) -> str:
    b, m = r["best"], r["measured_on"] or {}
    if b["interpreter"]:
        figure = (f"{b['time_ms']:.4g} ms under the Triton interpreter (no speedup: interpreter times measure "
                  f"nothing about GPU speed)")
    else:
        ci = f" (95% CI {b['speedup_ci'][0]:.3g}-{b['speedup_ci'][1]:.3g})" if b["speedup_ci"] else ""
        figure = f"{b['speedup']:.3g}x{ci}: {b['time_ms']:.4g} ms vs baseline {b['baseline_ms']:.4g} ms"
        if b["deciding_distribution"]:
            figure += f", deciding distribution {b['deciding_distribution']}"
    lines = [f"# Kernel exported from run {r['run_id']}", "",
             f"- problem: `{r['problem']['key']}` ({r['problem']['kind']}), source sha256 "
             f"`{r['problem']['source_sha256']}`",
             f"- kernel: candidate `{r['kernel']['candidate_id']}` (iteration {r['kernel']['iteration']}), "
             f"source sha256 `{r['kernel']['source_sha256']}`",
             f"- best: {figure}"]
    if b["rel_err"] is not None:
        lines.append(f"- relative error against the oracle: {b['rel_err']:.3g}")
    if m:
        lines.append(f"- measured on: {m.get('device') or '?'}, torch {m.get('torch') or '?'}, triton "
                     f"{m.get('triton') or '?'}, mode {m.get('mode') or '?'}"
                     + (f", driver {m['driver']}" if m.get("driver") else "")
                     + (f", {m['repetitions']} repetitions" if m.get("repetitions") else ""))
        if m.get("baseline_env"):
            lines.append(f"- the baseline ran with: {m['baseline_env']}")
    else:
        lines.append("- measured on: not recorded (the benchmark log is not in the artifact store)")
    lines += ["", "Re-verify against the problem's reference on this machine:", "", "```bash",
              r["verify_command"], "```", ""]
    return "\n".join(lines)


def export_run(wid: str, st, out: Path, force: bool = False, store: ArtifactStore | None = None) -> list[Path]:
    """Writes kernel.py, receipt.json, receipt.md (and the problem) into `out`; nothing is written when
    anything is missing or `out` holds an earlier export and `force` is not given."""
    store = store or ArtifactStore()
    if st.best is None:
        raise ExportError(f"run {wid} has no accepted kernel yet (no candidate has passed)")
    key = st.best_source_key or next((r.source_key for r in read_ledger(store, st.ledger_key)
                                      if r.candidate_id == st.best.candidate_id), None)
    if not key or not store.exists(key):
        raise ExportError(f"the best kernel of run {wid} is not in the artifact store at {store.root} "
                          "(MARATHON_ARTIFACTS names another)")
    source = store.get_text(key)
    try:
        prob = problem_source(st.problem, store)
    except (ArtifactStoreError, KeyError, TypeError, ValueError) as e:
        raise ExportError(f"the problem of run {wid} ({st.problem[:19]}) is not in the artifact store at "
                          f"{store.root}: {e}")
    names = ["kernel.py", "receipt.json", "receipt.md"] + \
        {"file": ["problem.py"], "folder": ["problem"]}.get(prob["kind"], [])
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    taken = [n for n in names if (out / n).exists()]
    if taken and not force:
        raise ExportError(f"{out} already holds {', '.join(taken)}; --force overwrites")
    problem_arg = {"file": str(out / "problem.py"), "folder": str(out / "problem")}.get(prob["kind"], st.problem)
    verify_cmd = f"marathon verify {shlex.quote(problem_arg)} {shlex.quote(str(out / 'kernel.py'))}"
    receipt = receipt_of(wid, st, store, source, key, prob, verify_cmd)
    out.mkdir(parents=True, exist_ok=True)
    written = []

    def write(path: Path, data: bytes):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        written.append(path)

    if prob["kind"] == "file":
        write(out / "problem.py", prob["files"]["problem.py"])
    elif prob["kind"] == "folder":
        (out / "problem").mkdir(exist_ok=True)
        for n, data in prob["files"].items():
            write(out / "problem" / Path(n).name, data)
    write(out / "kernel.py", kernel_file_text(wid, st, source, prob, verify_cmd).encode())
    write(out / "receipt.json", (json.dumps(receipt, indent=2) + "\n").encode())
    write(out / "receipt.md", receipt_markdown(receipt).encode())
    return written


# ---- verify ------------------------------------------------------------------------------------------------
def verify_kernel(problem_arg: str, kernel: Path, shape: str | None = None, started=None) -> tuple[bool, list[str]]:
    """The harness's verification of the kernel file against the problem (a built-in name, a problem file or
    folder, or a stored key), here: (passed, lines to print). ExportError for bad input. `started` is
    handed one line as the verification begins: where it runs and its stage's time limit."""
    from baselines.external.file import check_cpu_run, is_file_key, load_file
    from baselines.external.folder import folder_manifest, is_folder_key, read_folder
    from baselines.external.model_new import entry_source, kernel_part
    from baselines.problem import ProblemFileError
    from cli.spec import cuda_here
    from baselines.registry import UnknownProblem, check_problem_name, get_problem

    try:
        text = kernel.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ExportError(f"{kernel}: cannot read the kernel file: {getattr(e, 'strerror', None) or e}")
    cuda = cuda_here()
    tmp = tempfile.TemporaryDirectory(prefix="marathon-verify-")
    old = os.environ.get("MARATHON_ARTIFACTS")
    users = ArtifactStore(default_root())  # where a stored problem is copied from
    os.environ["MARATHON_ARTIFACTS"] = tmp.name  # the children load the problem from this store
    try:
        store = ArtifactStore(tmp.name)
        p = Path(problem_arg)
        try:
            if p.is_dir():
                files = read_folder(p)
                name, manifest = folder_manifest(files)
                for data in files.values():
                    store.put_bytes(data)
                store.put_json(manifest)
            elif problem_arg.endswith(".py") or p.is_file():
                if not p.is_file():
                    raise ExportError(f"{problem_arg}: no such file or folder")
                name, data, _ = load_file(p)
                store.put_bytes(data)
            else:
                name = problem_arg
                if is_file_key(name) or is_folder_key(name):  # a stored problem: copied from the user's store
                    src = problem_source(name, users)
                    for data in src["files"].values():
                        store.put_bytes(data)
                    if src["kind"] == "folder":
                        store.put_json(folder_manifest(src["files"])[1])
                check_problem_name(name)
            problem = get_problem(name)
            if name.startswith("file:"):
                if not cuda and shape != "get_inputs":
                    check_cpu_run(problem)
                text = entry_source(text, problem)
            else:
                text = kernel_part(text)
        except (ProblemFileError, UnknownProblem) as e:
            raise ExportError(str(e))
        except ArtifactStoreError as e:
            raise ExportError(f"problem {problem_arg[:19]} is not in the artifact store: {e}")
        names = [s.name for s in problem.shapes] + [problem.cpu_shape.name]
        if shape is not None and shape not in names:
            raise ExportError(f"problem {problem_arg} has no shape {shape!r}; shapes: {', '.join(names)}")
        from gpu_worker.harness import Evaluator
        from gpu_worker.settings import GpuWorkerSettings, SettingsError
        from workflows.contracts import EvalRequest

        try:  # the GPU worker's settings (the sandbox's limits, work directory, wall) apply here too
            settings = GpuWorkerSettings.from_env(os.environ)
        except SettingsError as e:
            raise ExportError(str(e))
        source_key = store.put_text(text)
        ev = Evaluator(store=store, interpreter=not cuda, settings=settings)
        if started:
            started(f"verifying {kernel} against {problem_arg} here ({'GPU' if cuda else 'CPU, Triton interpreter'}"
                    f"); a kernel that does not return is stopped after {ev.ctx.timeouts['verify']:.0f} s")
        try:
            rep = ev.verify(EvalRequest(problem=name, candidate_id=source_key[:16], source_key=source_key,
                                        shape=shape, random_shape=True))
        except Exception as e:  # noqa: BLE001 - the harness itself failed here: said in one line
            raise ExportError(f"the harness could not verify here: {type(e).__name__}: "
                              f"{(str(e).splitlines() or [''])[0][:300]}") from None
        finally:
            ev.close()
        where = "GPU" if cuda else "CPU, Triton interpreter"
        used = shape or (problem.shapes[0].name if cuda else problem.cpu_shape.name)
        if rep.ok:
            used += f", and at {rep.random_shape}" if rep.random_shape else ""
            return True, [f"PASS: {kernel} against {problem_arg} ({where}, shape {used}, every distribution): "
                          f"relative error {rep.rel_err:.3g} <= tolerance {rep.threshold:.3g}"
                          + (f" (the reference's own error {rep.baseline_rel_err:.3g})"
                             if rep.baseline_rel_err is not None else "")]
        return False, [f"FAIL: {kernel} against {problem_arg} ({where}, shape {used}): rejected at {rep.stage}"]\
            + ["  " + ln for ln in (rep.reason or "no reason given").splitlines()[:40]]
    finally:
        if old is None:
            os.environ.pop("MARATHON_ARTIFACTS", None)
        else:
            os.environ["MARATHON_ARTIFACTS"] = old
        tmp.cleanup()
