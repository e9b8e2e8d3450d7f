"""The GPU worker's settings (gpu_worker.settings): parsed once from the environment, typed, one clear error
per bad start, device defaults in one place, and no other module of the worker reading a setting itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpu_worker.settings import (DEVICE_DEFAULTS, INTERNAL_CHANNELS, GpuWorkerSettings, SettingsError,
                                 cuda_available, env_name, settings_table)

ROOT = Path(__file__).resolve().parents[2]
GPU_WORKER = ROOT / "gpu_worker"


def test_defaults():
    s = GpuWorkerSettings.from_env({"MARATHON_HOME": "/home/m"})
    # the caches go to the run's home; a model built in code keeps them in its GPU work directory
    assert s.cache_dir == Path("/home/m/cache") and GpuWorkerSettings().cache_dir is None
    assert s.model_copy(update={"cache_dir": None}) == GpuWorkerSettings()
    assert GpuWorkerSettings.from_env({}).cache_dir == Path.home() / ".marathon" / "cache"
    assert (s.device_jobs, s.seed_pool, s.prefetch_gb, s.sandbox_mem_gb, s.wall) == (4, 16, 0.5, 0.0, "on")
    assert s.timing_window_s == 4.0
    assert (s.bench_blocks, s.bench_reps, s.bench_block_ms, s.bench_total_ms) == (5, 20, 100.0, 500.0)
    assert not s.force_interpreter and s.timing_cpus is None and s.gpu_workdir is None
    assert s.warm_problem == "" and s.warm_shape is None
    # the device's defaults wait for the device
    assert all(getattr(s, name) is None for name in DEVICE_DEFAULTS)


def test_cuda_and_interpreter_defaults():
    cuda, cpu = GpuWorkerSettings().for_device(True), GpuWorkerSettings().for_device(False)
    assert (cuda.gpu_concurrency, cuda.spares, cuda.oracle_cache_gb, cuda.gpu_selftest) == (8, 4, 24.0, True)
    assert (cpu.gpu_concurrency, cpu.spares, cpu.oracle_cache_gb, cpu.gpu_selftest) == (2, 1, 2.0, False)
    # a value the user gave stays, on either device, and resolving twice changes nothing
    given = GpuWorkerSettings.from_env({"MARATHON_SPARES": "7", "MARATHON_GPU_SELFTEST": "0"})
    for dev in (True, False):
        r = given.for_device(dev)
        assert r.spares == 7 and r.gpu_selftest is False and r.for_device(not dev) == r


def test_values_parse_to_their_types():
    s = GpuWorkerSettings.from_env({
        "MARATHON_DEVICE_JOBS": " 2 ", "MARATHON_WALL": "Seccomp", "MARATHON_FORCE_INTERPRETER": "1",
        "MARATHON_GPU_SELFTEST": "0", "MARATHON_PREFETCH_GB": "1.5", "MARATHON_GPU_WORKDIR": "/scratch",
        "MARATHON_WARM_PROBLEM": "kda,mla_decode", "MARATHON_WARM_SHAPE": "", "MARATHON_SEED_POOL": "3",
        "OTHER": "ignored"})
    assert (s.device_jobs, s.wall, s.force_interpreter, s.gpu_selftest) == (2, "seccomp", True, False)
    assert s.prefetch_gb == 1.5 and s.gpu_workdir == Path("/scratch") and s.seed_pool == 3
    assert s.warm_problem == "kda,mla_decode" and s.warm_shape is None  # empty: unset
    assert GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": "2"}).timing_cpus == 2
    assert GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": "30,31"}).timing_cpus == (30, 31)
    assert GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": "28-29,4"}).timing_cpus == (4, 28, 29)


BAD = [
    ("MARATHON_DEVICE_JOBS", "abc", "an integer >= 1"),
    ("MARATHON_DEVICE_JOBS", "0", "an integer >= 1"),
    ("MARATHON_TIMING_WINDOW_S", "-1", "a number of seconds >= 0"),
    ("MARATHON_RETRY_BESIDE", "-2", "an integer >= 0"),
    ("MARATHON_WALL", "maybe", "on, landlock, seccomp or off"),
    ("MARATHON_GPU_CONCURRENCY", "eight", "an integer >= 1"),
    ("MARATHON_SPARES", "-1", "an integer >= 0"),
    ("MARATHON_SEED_POOL", "2", "an integer >= 3"),
    ("MARATHON_ORACLE_CACHE_GB", "lots", "a number of GiB >= 0"),
    ("MARATHON_PREFETCH_GB", "-0.5", "a number of GiB >= 0"),
    ("MARATHON_SANDBOX_MEM_GB", "32G", "a number of GiB >= 0"),
    ("MARATHON_TIMING_CPUS", "two", "a count (e.g. 2) or cores (e.g. 30,31 or 28-29)"),
    ("MARATHON_TIMING_CPUS", "5-3", "a count (e.g. 2) or cores (e.g. 30,31 or 28-29)"),
    ("MARATHON_TIMING_CPUS", "-1", "a count (e.g. 2) or cores (e.g. 30,31 or 28-29)"),
    ("MARATHON_GPU_SELFTEST", "maybe", "1 or 0"),
    ("MARATHON_FORCE_INTERPRETER", "2", "1 or 0"),
    ("MARATHON_PINNED_STAGING", "2", "1 or 0"),
    ("MARATHON_BENCH_BLOCKS", "5.5", "an integer >= 1"),
    ("MARATHON_BENCH_REPS", "0", "an integer >= 1"),
    ("MARATHON_BENCH_BLOCK_MS", "0", "a number of milliseconds > 0"),
    ("MARATHON_BENCH_TOTAL_MS", "fast", "a number of milliseconds > 0"),
    ("MARATHON_ORACLE_DISK_GB", "-1", "a number of GiB >= 0"),
    ("MARATHON_DEVICE_POLICY", "fifo", "owner or dispatcher"),
    ("MARATHON_TIMING_BATCH", "0", "an integer >= 1"),
    ("MARATHON_TIMING_MAX_WAIT_S", "-0.1", "a number of seconds >= 0"),
    ("MARATHON_WARM_ALL_SHAPES", "all", "1 or 0"),
    ("MARATHON_NCU_PROOF_SHARE", "1.5", "a fraction from 0 to 1"),
    ("MARATHON_NCU_PROOF_WALL", "tcp", "on or unix"),
]


@pytest.mark.parametrize("var,value,expected", BAD)
def test_a_bad_value_is_one_error_naming_the_variable(var, value, expected):
    with pytest.raises(SettingsError) as e:
        GpuWorkerSettings.from_env({var: value})
    msg = str(e.value)
    assert msg.startswith(f"{var}={value!r}: expected {expected}") and msg.count(";") == 0


def test_every_setting_with_a_range_is_covered_by_a_bad_value():
    checked = {var for var, _, _ in BAD}
    free_text = {"MARATHON_GPU_WORKDIR", "MARATHON_CACHE_DIR", "MARATHON_WARM_PROBLEM",
                 "MARATHON_WARM_SHAPE"}  # any text is a value
    assert checked | free_text == {env_name(n) for n in GpuWorkerSettings.model_fields}


def test_several_bad_values_are_one_error_naming_each():
    with pytest.raises(SettingsError) as e:
        GpuWorkerSettings.from_env({"MARATHON_DEVICE_JOBS": "abc", "MARATHON_WALL": "maybe"})
    assert "MARATHON_DEVICE_JOBS='abc'" in str(e.value) and "MARATHON_WALL='maybe'" in str(e.value)


def test_forcing_the_interpreter_means_no_cuda():
    assert cuda_available(GpuWorkerSettings(force_interpreter=True)) is False


def test_the_settings_travel_to_a_child_unchanged():
    s = GpuWorkerSettings.from_env({"MARATHON_TIMING_CPUS": "28-29", "MARATHON_GPU_WORKDIR": "/w",
                                    "MARATHON_WALL": "off", "MARATHON_HOME": "/h"}).for_device(False)
    assert s.cache_dir == Path("/h/cache")  # the child finds the worker's caches
    assert GpuWorkerSettings.from_child(s.to_child()) == s
    assert GpuWorkerSettings.from_child(None) == GpuWorkerSettings()


def test_the_worker_builds_its_evaluator_from_the_settings(monkeypatch, tmp_path):
    from gpu_worker import activities as a

    a.set_evaluator(None)
    s = GpuWorkerSettings.from_env({"MARATHON_FORCE_INTERPRETER": "1", "MARATHON_SPARES": "0",
                                    "MARATHON_CACHE_DIR": str(tmp_path / "cache"),
                                    "MARATHON_DEVICE_JOBS": "3", "MARATHON_GPU_CONCURRENCY": "5",
                                    "MARATHON_SEED_POOL": "7", "MARATHON_TIMING_WINDOW_S": "1.5"})
    ev = a.evaluator(s)
    try:
        assert ev.interpreter and ev.settings.gpu_selftest is False and ev.settings.oracle_cache_gb == 2.0
        assert ev.sched.spares == 0 and ev.owner.max_jobs == 3 and ev.loaded.limit == 10
        assert ev.owner.window_s == 1.5
        assert ev.settings.seed_pool == 7 and a.evaluator() is ev
    finally:
        ev.close()
        a.set_evaluator(None)
    # without settings it reads the environment, once: a bad value stops the start
    monkeypatch.setenv("MARATHON_DEVICE_JOBS", "abc")
    with pytest.raises(SettingsError, match="MARATHON_DEVICE_JOBS='abc'"):
        a.evaluator()
    a.set_evaluator(None)


def test_a_child_gets_the_worker_settings():
    """The wall setting reaches the candidate child through its channel: `off` is named in the load reply."""
    from gpu_worker.protocol import Load
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True, settings=GpuWorkerSettings(wall="off"))
    try:
        r = sb.call(Load(source="def run(inputs, out):\n    pass\n", problem="softmax", shape=None,
                         write_roots=[], trusted_roots=[]), 180)
        assert r.ok, r.failure
        assert r.result.wall == {"os": "off (MARATHON_WALL=off)"}
    finally:
        sb.close()


def test_the_docs_table_is_the_model():
    text = (ROOT / "docs" / "deploy.md").read_text()
    m = re.search(r"<!-- gpu-worker-settings -->\n(.*?)\n<!-- /gpu-worker-settings -->", text, re.S)
    assert m, "docs/deploy.md lost its settings table"
    assert m.group(1) == settings_table(), "regenerate with: python -c 'from gpu_worker.settings import " \
                                           "settings_table; print(settings_table())'"


# --- no module of the worker reads a setting from the environment itself ------------------------------

def _environ(node) -> bool:
    """`os.environ` or a bare `environ`."""
    return ((isinstance(node, ast.Attribute) and node.attr == "environ")
            or (isinstance(node, ast.Name) and node.id == "environ"))


def environment_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every MARATHON_* variable the source reads from the environment: os.environ.get/
    pop/setdefault, os.environ[...] as a value, os.getenv; names given by a module constant are resolved."""
    tree = ast.parse(source)
    consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def name(arg) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Name):
            return consts.get(arg.id, f"<{arg.id}>")
        return None

    found = []
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Call) and n.args:
            f = n.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and _environ(f.value):
                key = name(n.args[0])
            elif isinstance(f, ast.Attribute) and f.attr == "getenv":
                key = name(n.args[0])
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and _environ(n.value):
            key = name(n.slice)
        if key is not None and (key.startswith("MARATHON_") or key.startswith("<")):
            found.append((n.lineno, key))
    return found


def test_the_scan_finds_environment_reads():
    src = ("import os\nfrom os import environ\nX = 'MARATHON_SPARES'\n"
           "a = os.environ.get('MARATHON_WALL')\nb = os.environ['MARATHON_SEED_POOL']\n"
           "c = os.getenv('MARATHON_DEVICE_JOBS', '4')\nd = environ.pop(X, None)\nos.environ['MARATHON_OK'] = '1'\n"
           "e = os.environ.get('HOME')\n")
    assert environment_reads(src) == [(4, "MARATHON_WALL"), (5, "MARATHON_SEED_POOL"),
                                      (6, "MARATHON_DEVICE_JOBS"), (7, "MARATHON_SPARES")]


def test_only_the_settings_module_reads_settings_from_the_environment():
    from gpu_worker.settings import CHILD_SETTINGS

    allowed = set(INTERNAL_CHANNELS)
    offenders = []
    for path in sorted(GPU_WORKER.rglob("*.py")):
        if path.name == "settings.py" and path.parent == GPU_WORKER:
            continue
        for line, key in environment_reads(path.read_text()):
            if key == "<CHILD_SETTINGS>":
                key = CHILD_SETTINGS  # imported from settings
            if key not in allowed:
                offenders.append(f"{path.relative_to(ROOT)}:{line} reads {key}")
    assert not offenders, "read it through gpu_worker.settings instead:\n" + "\n".join(offenders)
