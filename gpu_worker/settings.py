"""The GPU worker's settings: one typed list, read from the environment once, when the worker starts.

Every user setting of the GPU worker is a field of `GpuWorkerSettings`, named after its variable
(`device_jobs` is `MARATHON_DEVICE_JOBS`). `GpuWorkerSettings.from_env(os.environ)` parses them all and
raises one `SettingsError` naming the variable and the form it expects; the worker does that at start
(gpu_worker.activities.evaluator) and hands the result down through constructors (Evaluator, Scheduler,
Sandbox, the children), so no other module reads a setting from the environment. An empty value is the
same as an unset one.

Defaults that differ between CUDA and the Triton interpreter are None in a parsed model and filled in by
`for_device(cuda)`, from `DEVICE_DEFAULTS` alone. Whether the worker has CUDA at all is `cuda_available`.

Internal channels, not settings: the worker sets these for a sandbox child (gpu_worker.sandbox) and the
child reads them at its start; users do not set them.

* `MARATHON_CHILD_SETTINGS`: this model, resolved, as JSON (the child's copy of the worker's settings);
* `MARATHON_CHILD_LIMITS`: the child's resource limits and cores (child.apply_limits);
* `MARATHON_GUARD_FD`: the pipe a candidate child's guard reports refusals on;
* `MARATHON_INPUT_BANK`: the directory of generated inputs the children share (child.inputs);
* `TRITON_INTERPRET`: Triton's own switch, set for a child under the interpreter.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ENV_PREFIX = "MARATHON_"

#: the channels above: set by the worker for its children, read by the children, never user settings
CHILD_SETTINGS = "MARATHON_CHILD_SETTINGS"
INTERNAL_CHANNELS = (CHILD_SETTINGS, "MARATHON_CHILD_LIMITS", "MARATHON_GUARD_FD", "MARATHON_INPUT_BANK")

#: field -> (default on CUDA, default under the interpreter)
DEVICE_DEFAULTS: dict[str, tuple[Any, Any]] = {
    "gpu_concurrency": (8, 2),
    "spares": (4, 1),
    "oracle_cache_gb": (24.0, 2.0),
    "gpu_selftest": (True, False),
    "oracle_disk_gb": (32.0, 1.0),
    "warm_all_shapes": (True, False),
}

#: where the caches go when MARATHON_CACHE_DIR is unset (the CLI's home: cli.home)
HOME_ENV = "MARATHON_HOME"

_CORES = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
_FLAG = "1 or 0 (also true/false, yes/no, on/off)"


class SettingsError(ValueError):
    """A setting's value does not parse: the message names the variable, its value and the expected form."""


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _setting(default, description: str, expected: str, shown_default: str | None = None, **limits):
    """A field: its default, its one line for the docs, the form its variable takes (for the error), its
    range (pydantic's ge/gt), and where the host decides the default, that default in words."""
    extra = {"expected": expected, **({"shown_default": shown_default} if shown_default else {})}
    return Field(default, description=description, json_schema_extra=extra, **limits)


class GpuWorkerSettings(BaseModel):
    """The GPU worker's settings. Each field's description is its line in docs/deploy.md's table; its
    extra's `expected` is the form its variable's value must have, `shown_default` the default in words where
    the host decides it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    force_interpreter: bool = _setting(
        False, "run every child under the Triton interpreter even where CUDA is present", _FLAG)
    gpu_selftest: bool | None = _setting(
        None, "run the canaries, all at once, beside serving; benchmark reports wait for them, a failure stops "
        "the worker", _FLAG)
    gpu_concurrency: int | None = _setting(
        None, "concurrent activities on each of the worker's two queues", "an integer >= 1", ge=1)
    spares: int | None = _setting(None, "warm candidate children kept ready", "an integer >= 0", ge=0)
    device_jobs: int = _setting(
        4, "untimed device jobs (uploads, verification, comparisons) at once between timing blocks",
        "an integer >= 1", ge=1)
    timing_window_s: float = _setting(
        4.0, "once the device is drained for timing, waiting timing blocks run back to back for up to this "
        "many seconds before jobs that asked earlier get the device again", "a number of seconds >= 0", ge=0)
    retry_beside: int = _setting(
        0, "a stage that ran out of device memory beside others runs again once at most this many other stages "
        "run (0: alone, once none runs); none enters while it waits", "an integer >= 0", ge=0)
    pinned_staging: bool = _setting(
        False, "children copy tensors of 1 MB or more between host and device through two pinned 16 MB buffers "
        "each, instead of the driver's pageable copies", _FLAG)
    device_policy: Literal["owner", "dispatcher"] = _setting(
        "owner", "who schedules the device: `owner` (a timing block drains the jobs when it asks) or `dispatcher` "
        "(blocks batched into windows; jobs admitted only where they end before the next)", "owner or dispatcher")
    timing_batch: int = _setting(
        2, "dispatcher: a timing window is due once this many blocks wait", "an integer >= 1", ge=1)
    timing_max_wait_s: float = _setting(
        1.0, "dispatcher: or once the oldest waiting block has waited this long", "a number of seconds >= 0", ge=0)
    timing_cpus: int | tuple[int, ...] | None = _setting(
        None, "cores kept for timed processes: how many, or which (`30,31`, `28-29`)",
        "a count (e.g. 2) or cores (e.g. 30,31 or 28-29)", shown_default="2 on hosts of 8 cores or more, else 0")
    gpu_workdir: Path | None = _setting(
        None, "sandbox scratch and the input bank; keep it on local disk", "a directory path",
        shown_default="`marathon-gpu-UID` in the temp directory")
    cache_dir: Path | None = _setting(
        None, "caches kept across restarts: oracles and baseline errors, ceilings, the self-test's verdict, "
        "Triton's kernels and autotuning choices", "a directory path", shown_default="`cache` in `MARATHON_HOME`")
    oracle_disk_gb: float | None = _setting(
        None, "the oracle cache's size on disk (GiB); past it the least recently used entries go",
        "a number of GiB >= 0", ge=0)
    sandbox_mem_gb: float = _setting(
        0.0, "host memory limit of each sandbox child in GiB; 0: half the host's memory, at most 32",
        "a number of GiB >= 0", ge=0)
    wall: Literal["on", "landlock", "seccomp", "off"] = _setting(
        "on", "the candidate children's OS wall: `on`, `landlock` (required), `seccomp` (fallback only) or `off`",
        "on, landlock, seccomp or off")
    seed_pool: int = _setting(
        16, "verification inputs' seeds come from this pool (3 per candidate, chosen by its id)",
        "an integer >= 3", ge=3)
    oracle_cache_gb: float | None = _setting(
        None, "oracle outputs kept on the reference child's device (LRU), in GiB", "a number of GiB >= 0", ge=0)
    prefetch_gb: float = _setting(
        0.5, "verification inputs up to this size (GiB) are uploaded ahead; larger sets case by case",
        "a number of GiB >= 0", ge=0)
    warm_problem: str = _setting(
        "", "problems warmed at start (ceilings, oracle bank, the baseline's first call): `kda,mla_decode` or "
        "`problem:shape` entries; the demo's worker (`make run`) warms the run's built-in problem unless this is "
        "set", "comma-separated problem or problem:shape entries")
    warm_all_shapes: bool | None = _setting(
        None, "a warmed problem named without a shape warms its other listed shapes too (their reference, "
        "the baseline's first call and its autotuning, one case per distribution)", _FLAG)
    warm_shape: str | None = _setting(
        None, "the shape warmed for `MARATHON_WARM_PROBLEM` entries that name none (default: the primary shape)",
        "a shape name")
    bench_blocks: int = _setting(
        5, "interleaved timing blocks per distribution on CUDA, at most (fewer for slow baselines, never fewer "
        "than 3)", "an integer >= 1", ge=1)
    bench_reps: int = _setting(
        20, "timed repetitions per side and block on CUDA, at most (fewer for slow baselines, never fewer than 5)",
        "an integer >= 1", ge=1)
    bench_block_ms: float = _setting(
        100.0, "about this much baseline time (ms) per timing block: sets the repetitions for slow baselines",
        "a number of milliseconds > 0", gt=0)
    bench_total_ms: float = _setting(
        500.0, "about this much baseline time (ms) per distribution: sets the blocks for slow baselines",
        "a number of milliseconds > 0", gt=0)
    ncu_proof_share: float = _setting(
        0.1, "share of the other passing candidates proven, like every would-be best, by Nsight Compute in a "
        "separate process (drawn with the worker's secret generator)", "a fraction from 0 to 1", ge=0, le=1)
    ncu_proof_wall: Literal["on", "unix"] = _setting(
        "on", "the ncu proof process's OS wall: `on` (the candidate children's) or `unix` (that, plus AF_UNIX "
        "sockets for ncu's channel to its front end)", "on or unix")

    @field_validator("wall", "device_policy", "ncu_proof_wall", mode="before")
    @classmethod
    def _any_case(cls, v):
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("timing_cpus", mode="before")
    @classmethod
    def _cores(cls, v):
        """"2" is a count; "30,31" or "28-29" (a range, inclusive) name cores."""
        if not isinstance(v, str):
            return v
        spec = v.strip()
        if spec.isdigit():
            return int(spec)
        if not _CORES.match(spec):
            raise ValueError("not a count or a list of cores")
        cores: list[int] = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            if int(hi or lo) < int(lo):
                raise ValueError(f"range {part} runs backwards")
            cores += range(int(lo), int(hi or lo) + 1)
        return tuple(sorted(set(cores)))

    @field_validator("timing_cpus")
    @classmethod
    def _no_negative_cores(cls, v):
        if v is not None and min((v,) if isinstance(v, int) else v or (0,)) < 0:
            raise ValueError("negative")
        return v

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "GpuWorkerSettings":
        """Every MARATHON_* setting in `environ` parsed; variables that are unset or empty take their
        defaults (those of `DEVICE_DEFAULTS` stay None until `for_device`). Raises one SettingsError that
        names each bad variable, its value and the expected form."""
        raw = {}
        for name in cls.model_fields:
            value = environ.get(env_name(name))
            if value is not None and value.strip():
                raw[name] = value.strip()
        if "cache_dir" not in raw:  # the run's home, as the CLI's (cli.home) and the artifact store's
            raw["cache_dir"] = str(Path((environ.get(HOME_ENV) or "").strip() or Path.home() / ".marathon") / "cache")
        try:
            return cls(**raw)
        except ValidationError as e:
            lines = []
            for err in e.errors():
                field = str(err["loc"][0]) if err["loc"] else ""
                extra = cls.model_fields[field].json_schema_extra if field in cls.model_fields else None
                expected = (extra or {}).get("expected", "a valid value")
                lines.append(f"{env_name(field)}={raw.get(field)!r}: expected {expected}")
            raise SettingsError("; ".join(dict.fromkeys(lines))) from None

    def for_device(self, cuda: bool) -> "GpuWorkerSettings":
        """The same settings with every unset CUDA/interpreter-dependent default filled in."""
        fill = {k: v[0 if cuda else 1] for k, v in DEVICE_DEFAULTS.items() if getattr(self, k) is None}
        return self.model_copy(update=fill) if fill else self

    def to_child(self) -> str:
        """This model as the child's channel carries it (MARATHON_CHILD_SETTINGS)."""
        return self.model_dump_json()

    @classmethod
    def from_child(cls, text: str | None) -> "GpuWorkerSettings":
        """The worker's settings as a child receives them; defaults where the channel is absent (a child
        started by hand)."""
        return cls.model_validate_json(text) if text else cls()


def work_root(workdir: Path | None = None) -> Path:
    """The settings' gpu_workdir (MARATHON_GPU_WORKDIR), by default marathon-gpu-UID in the temp directory."""
    root = Path(workdir or Path(tempfile.gettempdir()) / f"marathon-gpu-{os.getuid()}")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cuda_available(settings: GpuWorkerSettings | None = None) -> bool:
    """Whether this worker runs its children on CUDA: a device is present and `settings` (default: the
    defaults) do not force the interpreter."""
    if settings is not None and settings.force_interpreter:
        return False
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no usable torch build: the interpreter
        return False


def settings_table() -> str:
    """The settings as a Markdown table (docs/deploy.md holds a copy; a test keeps it equal)."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, f in GpuWorkerSettings.model_fields.items():
        if name in DEVICE_DEFAULTS:
            cuda, interp = DEVICE_DEFAULTS[name]
            default = f"{_shown(cuda)} (CUDA), {_shown(interp)} (interpreter)"
        elif "shown_default" in (f.json_schema_extra or {}):
            default = f.json_schema_extra["shown_default"]
        else:
            default = _shown(f.default)
        rows.append(f"| `{env_name(name)}` | {default} | {f.description} |")
    return "\n".join(rows)


def _shown(v) -> str:
    if v is None or v == "":
        return "unset"
    if isinstance(v, bool):
        return "1" if v else "0"
    return f"{v:g}" if isinstance(v, float) else str(v)
