"""A timed call's fingerprint (gpu_worker.child.exports): the projection computed in chunks equals the projection
of the whole output onto the same vector, the vectors are the same for the same seed in another process,
and a different output, or one of another size, does not pass for the right one. The reference child times
the baseline on the entries the candidate's block ran on, and a candidate's report of them is checked
against the entries it was given before it is used."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import torch

from gpu_worker import child
from gpu_worker.child import exports as child_exports
from gpu_worker.timing_inputs import entry_seed

REPO = Path(__file__).resolve().parents[2]


def server(tmp_path, monkeypatch, chunk: int):
    monkeypatch.setattr(child_exports, "FINGERPRINT_CHUNK", chunk)
    s = child.Server(str(tmp_path), "reference")
    s.cmd_setup("softmax", None)  # on the CPU: the cpu_shape, M16 N300
    return s


def test_chunked_projection_is_the_whole_projection(tmp_path, monkeypatch):
    s = server(tmp_path, monkeypatch, chunk=1000)  # 4,800 elements: 5 chunks, the last one short
    proj = s.exports._projections(seed=12345)
    assert list(proj) == ["y"] and proj["y"].numel() == 16 * 300
    y = torch.randn(16, 300)
    (fp,) = s.exports._fingerprint({"y": y}, proj)
    whole = float(torch.dot(y.reshape(-1).double(), proj["y"].double()))
    assert math.isclose(float(fp), whole, rel_tol=1e-5, abs_tol=1e-3)
    ((fp2, sq),) = s.exports._fingerprint({"y": y}, proj, squares=True)
    assert float(fp2) == float(fp)
    norm = math.sqrt(float(sq))
    assert math.isclose(norm, float(torch.linalg.vector_norm(y.double())), rel_tol=1e-5)
    other = y.clone()
    other[5] = torch.randn(300)  # one row stale
    (fo,) = s.exports._fingerprint({"y": other}, proj)
    assert abs(float(fo) - float(fp)) > 1e-3 * norm
    try:
        s.exports._fingerprint({"y": torch.randn(16, 299)}, proj)
        raise AssertionError("an output of another size was fingerprinted")
    except ValueError as e:
        assert "holds 4784 elements, its spec 4800" in str(e)


def test_the_same_seed_draws_the_same_vectors_in_another_process(tmp_path, monkeypatch):
    s = server(tmp_path, monkeypatch, chunk=child_exports.FINGERPRINT_CHUNK)
    here = s.exports._projections(seed=777)["y"].float()
    code = ("import sys, torch\nfrom gpu_worker import child\n"
            "s = child.Server(sys.argv[1], 'reference'); s.cmd_setup('softmax', None)\n"
            "torch.save(s.exports._projections(seed=777)['y'], sys.argv[1] + '/v.pt')\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    there = torch.load(tmp_path / "v.pt").float()
    assert torch.equal(here, there)
    assert not torch.equal(here, s.exports._projections(seed=778)["y"].float())


def test_the_reference_times_the_baseline_on_the_candidates_entries_and_fingerprints_them(tmp_path, monkeypatch):
    s = server(tmp_path, monkeypatch, chunk=child_exports.FINGERPRINT_CHUNK)
    s.cmd_prepare(rotate=2, pool=3, dist="normal", seed=11)
    entries = [4, 1, 7, 9, 2]
    r = s.cmd_time(reps=20, warmup=1, dist="normal", check_seed=99, entries=entries, noise_seed=5, first=100)
    assert len(r.times) == 5 and [c[0] for c in r.checks] == entries and r.check_names == ["y"]
    ts = s.timing.timing_sets["normal"]
    proj = s.exports._projections(99)
    for (e, fps, norms) in r.checks:  # each the baseline's own output on that entry's values, with its norm
        y = s.core.baseline(ts.values(e, entry_seed(5, e)))["y"]
        assert math.isclose(fps[0], float(s.exports._fingerprint({"y": y}, proj)[0]), rel_tol=1e-4, abs_tol=1e-4)
        assert math.isclose(norms[0], float(torch.linalg.vector_norm(y.double())), rel_tol=1e-5)
    for bad, why in (([-1], "non-negative"), ([], "non-empty"), ([3, 3], "distinct"), ([100], "distinct"),
                     ([2.0], "non-negative ints")):
        try:
            s.cmd_time(reps=5, dist="normal", check_seed=99, entries=bad, noise_seed=5, first=100)
            raise AssertionError(f"entries {bad} were timed")
        except ValueError as e:
            assert why in str(e), (bad, e)
    # given the candidate's keys, the baseline runs on the values they draw, and the kept outputs'
    # comparison finds them by (noise seed, entry)
    keys = [11, 22, 33]
    r = s.cmd_time(reps=3, warmup=1, dist="normal", check_seed=99, entries=[200, 201, 202], keys=keys,
                   noise_seed=5, first=300)
    assert r.keys == keys
    for (e, fps, _), k in zip(r.checks, keys):
        y = s.core.baseline(ts.values(e, k))["y"]
        assert math.isclose(fps[0], float(s.exports._fingerprint({"y": y}, proj)[0]), rel_tol=1e-4, abs_tol=1e-4)
        assert torch.equal(s.timing._baseline_at(ts, e, 5)["y"], y)
    for bad in ([1, 1, 2], [1, 2], [-1, 2, 3], [1, 2, 2.0]):
        try:
            s.cmd_time(reps=3, dist="normal", check_seed=99, entries=[200, 201, 202], keys=bad, noise_seed=5, first=300)
            raise AssertionError(f"keys {bad} were taken")
        except ValueError as e:
            assert "keys" in str(e), (bad, e)
    try:  # values another process is to derive need the benchmark's seed
        s.cmd_time(reps=5, dist="normal", check_seed=99)
        raise AssertionError("fingerprinted without a noise seed")
    except ValueError as e:
        assert "noise_seed" in str(e)


def test_a_candidates_report_of_its_timed_calls_is_checked_before_the_baseline_runs_on_it():
    from gpu_worker.harness.timed_outputs import _check_entries
    from gpu_worker.sandbox import Rejection

    good = [[3, [0.5]], [4, [1.5]]]
    _check_entries(good, 2, [3, 4])
    _check_entries(good, 2, [3, 4], [7, 9])
    for keys in ([7, 7], [7], [7, -1], [7, 1 << 63], [7, "9"]):  # repeated, missing or unfit keys
        try:
            _check_entries(good, 2, [3, 4], keys)
            raise AssertionError(f"keys {keys} accepted")
        except Rejection as e:
            assert "timed-output" in str(e) and "altered" in str(e)
    _check_entries([], 2, [3, 4])  # no seed, no report: nothing to pair (the fingerprint check says so)
    for bad, reps in ([good, 3], ([[4, [0.5]], [3, [1.5]]], 2), ([[3, [0.5]], [3, [1.5]]], 2),
                      ([["3", [0.5]], [4, [1.5]]], 2), ([[3.0, [0.5]], [4, [1.5]]], 2), ([[3], [4, [1.5]]], 2),
                      ([[3, ["0.5"]], [4, [1.5]]], 2)):
        try:
            _check_entries(bad, reps, [3, 4])
            raise AssertionError(f"{bad} accepted")
        except Rejection as e:
            assert "timed-output" in str(e) and "altered" in str(e)
