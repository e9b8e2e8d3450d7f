"""A run's input from the command line: the RunSpec, a problem file or folder stored by content key,
and the hints a search run takes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from workflows import decisions
from workflows.contracts import RunSpec, explain
from cli.errors import UsageError


def cuda_here() -> bool:
    """Whether this process sees a CUDA device: without one, a run started here is a CPU run."""
    import torch

    return torch.cuda.is_available()


def parse_spec(args) -> RunSpec:
    """A RunSpec from --spec JSON (or @file) overlaid with the flags; validated before any connection."""
    from baselines.registry import UnknownProblem, check_problem_name

    raw: dict = {}
    if args.spec:
        try:
            text = Path(args.spec[1:]).read_text() if args.spec.startswith("@") else args.spec
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--spec {args.spec}: cannot read the file: {getattr(e, 'strerror', None) or e}")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"--spec is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
        if not isinstance(raw, dict):
            raise UsageError("--spec must be a JSON object")
    if args.problem:
        raw["problem"] = args.problem
    if "problem" not in raw:
        from baselines.registry import problem_names

        raise UsageError(f"which problem? name one of {', '.join(problem_names())} (`marathon problems` describes "
                         f"them), a problem file or a problem folder")
    start_kernel = read_start_kernel(args.kernel) if getattr(args, "kernel", None) else None
    problem_file = None
    if isinstance(raw.get("problem"), str) and is_problem_path(raw["problem"]):
        problem_file = load_problem_path(raw["problem"])
        raw["problem"] = problem_file.name
    budget = dict(raw.get("budget") or {})
    for flag, field in (("iterations", "iterations"), ("hours", "hours"), ("tokens", "tokens"),
                        ("gpu_seconds", "gpu_seconds")):
        v = getattr(args, flag, None)
        if v is not None:
            budget[field] = v
    if budget:
        raw["budget"] = budget
    for flag in ("policy", "population", "compact_every", "seed", "shape", "model", "gpu_queue",
                 "turns_per_iteration"):
        v = getattr(args, flag, None)
        if v is not None:
            raw[flag] = v
    # The default and the check below live at this entry point, not in RunSpec: RunSpec is every stored
    # run's input, and a new default or a new rule there would change how old histories replay.
    if ("compact_every" not in raw and raw.get("policy", "search") == "search" and isinstance(raw.get("population"), int)
            and raw["population"] > 0):
        raw["compact_every"] = decisions.default_compact_every(raw["population"])
    try:
        spec = RunSpec.model_validate(raw)
    except ValidationError as e:
        raise UsageError(f"invalid run spec: {explain(e)}")
    if problem := decisions.compaction_problem(spec.policy, spec.population, spec.compact_every):
        raise UsageError(f"invalid run spec: {problem}")
    if spec.carried is not None:
        raise UsageError("invalid run spec: 'carried' is set only by continue-as-new")
    if start_kernel is not None and spec.policy != "search":
        raise UsageError("--kernel is the search policy's starting template; the llm policy writes its own")
    if problem_file is not None:
        store_problem_file(spec, problem_file, start_kernel is not None)
    if start_kernel is not None:
        spec = spec.model_copy(update={"start_kernel": store_start_kernel(start_kernel)})
    try:
        check_problem_name(spec.problem)
    except UnknownProblem as e:
        raise UsageError(str(e))
    if spec.shape is not None:
        from baselines.registry import get_problem

        names = [s.name for s in get_problem(spec.problem).shapes] + [get_problem(spec.problem).cpu_shape.name]
        if spec.shape not in names:
            raise UsageError(f"problem {spec.problem} has no shape {spec.shape!r}; shapes: {', '.join(names)}")
    return spec


def is_problem_path(name: str) -> bool:
    """A problem given as a path (a KernelBench-format file) rather than a built-in problem's name."""
    from baselines.registry import problem_names

    if name.startswith(("file:", "folder:")) or name in problem_names():
        return False
    return name.endswith(".py") or os.sep in name or Path(name).exists()


def load_problem_path(path: str):
    """The problem a KernelBench-format file or a problem folder makes (baselines/external/), or one line
    saying why not."""
    from baselines.external.file import load_file
    from baselines.external.folder import folder_manifest, load_folder, read_folder
    from baselines.problem import ProblemFileError

    p = Path(path)
    try:
        if p.is_dir():  # the richer form: spec, oracle, baseline, kernel, knobs
            files = read_folder(p)
            key, manifest = folder_manifest(files)
            problem = load_folder(p.resolve(), key, str(path))
            problem.stored = (files, manifest)
            return problem
        if not p.is_file():
            raise UsageError(f"{path}: no such file or folder")
        _key, _data, problem = load_file(p)
    except ProblemFileError as e:
        raise UsageError(str(e))
    return problem


def check_problem_file(problem, policy: str, shape: str | None, start_kernel: bool = False) -> None:
    """What a run of `policy` at `shape` needs of its problem file or folder, or one line saying what is
    missing: knobs for the search policy (a folder's, or a starting kernel's for a file); a file's CPU
    inputs for a run here without CUDA."""
    from baselines.external.file import GPU_SHAPE, check_cpu_run
    from baselines.external.folder import is_folder_key
    from baselines.problem import ProblemFileError

    if is_folder_key(problem.name):
        if policy == "search" and not start_kernel:
            try:
                problem.default_knobs()
                if not problem.knob_space():
                    raise ValueError("knobs.py's SPACE is empty")
            except (OSError, ValueError, KeyError, SyntaxError) as e:
                raise UsageError(f"{getattr(problem, 'own_name', problem.name)}: the search policy needs kernel.py "
                                 f"with a KNOBS line and knobs.py with SPACE ({e}); or use --policy llm")
        return
    if policy == "search" and not start_kernel:
        raise UsageError(f"{problem.label} is a problem file: it has no template kernel for the search policy to "
                         f"tune; hand one in with --kernel START.py (a KNOBS line and KNOB_SPACE), or use "
                         f"--policy llm")
    if shape != GPU_SHAPE and not cuda_here():
        # no CUDA here: the run is taken to be a CPU (interpreter) run, unless --shape names the GPU inputs
        try:
            check_cpu_run(problem)
        except ProblemFileError as e:
            raise UsageError(f"{e} (--shape {GPU_SHAPE} starts a run for GPU workers from here)")


def read_start_kernel(path: str) -> str:
    """The text of a starting kernel for the search policy, checked (KNOBS and KNOB_SPACE), or one line
    saying what is wrong."""
    from baselines.problem import start_kernel_knobs

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--kernel {path}: cannot read the file: {getattr(e, 'strerror', None) or e}")
    try:
        start_kernel_knobs(text)
    except ValueError as e:
        raise UsageError(f"--kernel {path}: {e}")
    return text


def store_start_kernel(text: str) -> str:
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    try:
        return ArtifactStore().put_text(text)
    except ArtifactStoreError as e:
        raise UsageError(str(e))


def store_problem_file(spec: RunSpec, problem, start_kernel: bool = False) -> None:
    """Checks what the run needs of its problem file (or folder), then stores the bytes under their content
    keys (a folder's manifest last): the run names its problem by that key, so editing or deleting the file
    later changes nothing."""
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    check_problem_file(problem, spec.policy, spec.shape, start_kernel)
    try:
        store = ArtifactStore()
        if hasattr(problem, "stored"):  # a folder
            files, manifest = problem.stored
            for data in files.values():
                store.put_bytes(data)
            store.put_json(manifest)  # last: the folder's key names only objects already stored
        else:
            store.put_bytes(problem.data)
    except ArtifactStoreError as e:
        raise UsageError(str(e))


def search_space(spec: RunSpec) -> dict:
    """The knob space a search run tunes: its starting kernel's KNOB_SPACE, or its problem's."""
    from baselines.problem import UnknownProblem, start_kernel_knobs
    from baselines.registry import get_problem
    from workflows.artifacts import ArtifactStore, ArtifactStoreError

    if spec.start_kernel is None:
        # the spec comes from the run's history, where the workflow alone checked the problem: a run started
        # by the plain temporal CLI on an unknown problem (failed at once) or on a problem file stored elsewhere
        try:
            return get_problem(spec.problem).knob_space()
        except UnknownProblem as e:
            raise UsageError(f"the run's problem cannot be loaded here to check the hint: {e}")
    try:
        return start_kernel_knobs(ArtifactStore().get_text(spec.start_kernel))[1]
    except (OSError, ArtifactStoreError, ValueError) as e:
        raise UsageError(f"the run's starting kernel {spec.start_kernel[:16]} cannot be read here: {e}")


def check_hint(spec: RunSpec, text: str) -> None:
    """A search run's hint must be `KNOB=value` pairs from its knob space: anything else would be ignored by
    the search proposer without a word."""
    from activities.search import hint_problem

    why = hint_problem(search_space(spec), text, spec.problem)
    if why:
        raise UsageError(why)
