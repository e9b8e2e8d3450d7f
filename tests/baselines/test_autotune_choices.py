"""Shipped autotuning choices (baselines.autotune_choices): captured from an autotuner's cache, seeded into a
fresh process's autotuner so that its first call benchmarks nothing, and refused where they do not belong.
The kernels run under the Triton interpreter in a subprocess (TRITON_INTERPRET is read when triton loads);
the interpreter cannot benchmark, so there a call whose key holds no choice fails, and one that runs used a
seeded choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from baselines import autotune_choices as choices

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {"gpu": "NVIDIA H100 80GB HBM3", "triton": "3.6.0", "fla": "0.6.0"}
SAMPLE = "tests.baselines.autotune_sample"

# Captures a choice (config 1, as autotuning would have made it) for N = 100 and writes the document; a
# second process seeds it, after checking that an unseeded call cannot run on the interpreter.
SCRIPT = r"""
import json, sys, torch
from baselines import autotune_choices as choices
import tests.baselines.autotune_sample as sample
import tests.baselines.autotune_sample_user
versions = json.loads(sys.argv[2])
tuner = sample.double
out = {}
if sys.argv[1] == "capture":
    tuner.cache[(100, "torch.float32", "torch.float32")] = sample.CONFIGS[1]
    print(json.dumps(choices.capture("tests.baselines.autotune_sample", versions, note="by hand")))
    raise SystemExit
x = torch.arange(100, dtype=torch.float32)
try:
    sample.run(x)
    out["unseeded"] = "ran"
except Exception as e:
    out["unseeded"] = type(e).__name__
doc = json.loads(open(sys.argv[3]).read())
done = choices.seed(doc, "tests.baselines.autotune_sample", versions)
out["seeded"] = [done.used, done.skipped, done.refused, done.kernels]
try:
    y = sample.run(x)
    out["ran"] = bool(torch.equal(y, 2 * x))
    out["config"] = sample.CONFIGS.index(tuner.best_config)
except Exception as e:
    out["ran"] = type(e).__name__
out["benchmarked"] = hasattr(tuner, "bench_time")
print(json.dumps(out))
"""


def _run(*args: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(_run("capture", json.dumps(VERSIONS)))


def test_a_capture_names_each_autotuner_once_by_its_defining_module(doc):
    assert doc["format"] == choices.FORMAT and doc["versions"] == VERSIONS and doc["note"] == "by hand"
    # the re-export in autotune_sample_user is the same autotuner: one entry, under the defining module
    assert list(doc["kernels"]) == [f"{SAMPLE}.double"], doc
    (row,) = doc["kernels"][f"{SAMPLE}.double"]
    assert row["key"] == [100, "torch.float32", "torch.float32"]
    assert row["config"] == {"kwargs": {"BLOCK": 32}, "num_warps": 2, "num_stages": 3, "num_ctas": 1,
                             "maxnreg": None, "ir_override": None}


def _seeded(doc: dict, tmp_path, versions=VERSIONS) -> dict:
    path = tmp_path / "choices.json"
    path.write_text(json.dumps(doc))
    return json.loads(_run("seed", json.dumps(versions), str(path)))


@pytest.mark.slow(10)
def test_a_fresh_process_runs_the_seeded_choice_without_benchmarking(doc, tmp_path):
    got = _seeded(doc, tmp_path)
    assert got["unseeded"] == "RuntimeError", got  # the interpreter cannot autotune: no driver to time with
    assert got["seeded"] == [1, 0, "", [f"{SAMPLE}.double"]], got
    assert got["ran"] is True and got["config"] == 1 and got["benchmarked"] is False, got


@pytest.mark.slow(10)
def test_choices_of_other_versions_or_configs_are_not_used(doc, tmp_path):
    other = _seeded(doc, tmp_path, {**VERSIONS, "gpu": "NVIDIA H200"})
    assert other["seeded"][0] == 0 and "captured with" in other["seeded"][2], other
    assert other["ran"] == "RuntimeError", other  # nothing was put in place
    changed = json.loads(json.dumps(doc))
    changed["kernels"][f"{SAMPLE}.double"][0]["config"]["num_warps"] = 8  # a config the kernel does not list
    changed["kernels"][f"{SAMPLE}.gone"] = [{"key": [1], "config": {}}]  # a kernel this version lacks
    got = _seeded(changed, tmp_path)
    assert got["seeded"][:3] == [0, 2, ""] and got["ran"] == "RuntimeError", got


def test_bad_documents_are_refused_in_one_line(tmp_path):
    assert choices.seed({"format": 99, "kernels": {}}, SAMPLE, VERSIONS).refused.startswith("not a format-1")
    assert choices.seed([], SAMPLE, VERSIONS).refused
    assert choices.read(tmp_path / "missing.json") is None
    (tmp_path / "cut.json").write_text('{"format": 1, "kern')
    assert choices.read(tmp_path / "cut.json") is None


def test_a_file_name_per_gpu_model():
    assert choices.gpu_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3.json"
    assert choices.gpu_file_name("NVIDIA H200") == "NVIDIA-H200.json"
    assert choices.gpu_file_name("") == "unknown-gpu.json"


def test_the_shipped_kda_choices_are_well_formed():
    """Each shipped document names its GPU model in its file name, FLA's kernels, and whole configs."""
    from baselines.kda.baseline import CHOICES_DIR

    for path in sorted(CHOICES_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["format"] == choices.FORMAT, path
        assert set(doc["versions"]) == {"gpu", "triton", "fla"}, path
        assert choices.gpu_file_name(doc["versions"]["gpu"]) == path.name, path
        assert doc["kernels"] and all(k.startswith("fla.") for k in doc["kernels"]), path
        for rows in doc["kernels"].values():
            for row in rows:
                assert isinstance(row["key"], list) and set(row["config"]) == set(choices._CONFIG_FIELDS), path


def test_the_kda_adapter_reports_what_it_seeded_and_never_fails_on_the_choices(tmp_path, monkeypatch):
    """FLA itself needs a GPU; here the adapter's bookkeeping: no document, one of this process's versions
    whose kernels are not loadable, and versions that cannot be read (no GPU) all leave FLA to autotune."""
    from baselines.kda import baseline

    monkeypatch.setattr(baseline, "FLA_ENV", {})
    monkeypatch.setattr(baseline, "fla_versions", lambda: dict(VERSIONS))
    assert baseline.seed_shipped_choices(tmp_path / "none.json") == \
        "autotuned here: no choices shipped for NVIDIA H100 80GB HBM3"
    assert baseline.seed_shipped_choices() == baseline.FLA_ENV["autotune"]  # once a process

    doc = {"format": choices.FORMAT, "versions": VERSIONS, "note": "",
           "kernels": {"fla.not_here.kernel": [{"key": [1], "config": {}}]}}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    monkeypatch.setattr(baseline, "FLA_ENV", {})
    assert baseline.seed_shipped_choices(tmp_path / "c.json") == "0 shipped choices from c.json (1 passed over)"

    monkeypatch.setattr(baseline, "FLA_ENV", {})
    monkeypatch.setattr(baseline, "fla_versions", lambda: {}["gpu"])
    assert baseline.seed_shipped_choices().startswith("autotuned here: the shipped choices not read (KeyError")


def test_kda_names_what_its_baseline_ran_with(monkeypatch):
    """Problem.baseline_env, which the reference child's receipt carries into each benchmark's log."""
    from baselines.kda import baseline
    from baselines.registry import get_problem

    monkeypatch.setattr(baseline, "FLA_ENV", {})
    assert get_problem("kda").baseline_env() == ""  # FLA has not run here
    monkeypatch.setattr(baseline, "FLA_ENV", {"autotune": "3 shipped choices from G.json (0 passed over)",
                                              "FLA_FLASH_KDA": "0"})
    assert get_problem("kda").baseline_env() == "FLA_FLASH_KDA=0; autotune=3 shipped choices from G.json (0 passed over)"
    assert get_problem("softmax").baseline_env() == ""
