"""Caches that survive restarts (gpu_worker.caches): entries keyed by what decides them and checked on every
read; a stale, corrupt or mismatched entry is rebuilt and logged once; a restarted worker's reference child
(a new process) reads the cases its predecessor computed instead of computing them again."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from baselines.registry import get_problem
from gpu_worker.caches import DiskCache, ReferenceCaseCache, code_tag, key_digest, reference_key
from gpu_worker.settings import GpuWorkerSettings

KEY = {"kind": "t", "problem": "softmax", "shape": "S", "dist": "unit", "seed": 1}


# --- entries --------------------------------------------------------------------------------------

def test_an_entry_round_trips_and_any_part_of_its_key_moves_it(tmp_path):
    c = DiskCache(tmp_path, "t")
    assert c.get(KEY) is None
    c.put(KEY, b"payload")
    assert c.get(KEY) == b"payload"
    for part, other in [("problem", "kda"), ("shape", "S2"), ("dist", "peaked"), ("seed", 2), ("kind", "u")]:
        changed = {**KEY, part: other}
        assert key_digest(changed) != key_digest(KEY) and c.path(changed) != c.path(KEY)
        assert c.get(changed) is None, part
    assert key_digest(dict(reversed(list(KEY.items())))) == key_digest(KEY)  # the order of its parts is not


@pytest.mark.parametrize("damage", ["flip", "truncate", "header", "garbage", "other-key"])
def test_a_corrupt_or_mismatched_entry_reads_absent_is_removed_and_logged_once(tmp_path, capsys, damage):
    c = DiskCache(tmp_path, "t")
    path = c.put(KEY, b"x" * 1000)
    raw = path.read_bytes()
    if damage == "flip":
        path.write_bytes(raw[:-10] + b"y" + raw[-9:])
    elif damage == "truncate":
        path.write_bytes(raw[:-1])
    elif damage == "header":
        path.write_bytes(b"not a cache\n" + raw)
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff" * 50)
    else:  # a file of another key renamed to this key's name: its header says so
        other = c.put({**KEY, "seed": 99}, b"x" * 1000)
        other.replace(path)
    assert c.get(KEY) is None and not path.exists()
    assert capsys.readouterr().out.count(str(path)) == 1
    c.put(KEY, b"x" * 1000)  # rebuilt
    assert c.get(KEY) == b"x" * 1000


def test_a_write_is_atomic_and_leaves_no_temp_file(tmp_path):
    c = DiskCache(tmp_path, "t")
    c.put(KEY, b"a" * 10)
    c.put(KEY, b"b" * 10)  # replaced whole
    assert c.get(KEY) == b"b" * 10
    assert [p.name for p in c.dir.iterdir()] == [c.path(KEY).name]


def test_past_its_size_the_least_recently_used_entries_go(tmp_path):
    c = DiskCache(tmp_path, "t", max_bytes=4000)  # three entries of 1000 bytes and a header each
    keys = [{**KEY, "seed": i} for i in range(3)]
    for i, k in enumerate(keys):
        c.put(k, bytes(1000))
        t = time.time() - 100 + i
        os.utime(c.path(k), (t, t))
    assert c.get(keys[0]) is not None  # a hit makes it recent
    c.put({**KEY, "seed": 3}, bytes(1000))
    assert c.get(keys[1]) is None and c.get(keys[0]) is not None and c.get(keys[2]) is not None


def test_a_code_tag_follows_every_file(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    tag = code_tag([a, b])
    b.write_text("y = 3\n")
    assert code_tag([a, b]) != tag
    assert code_tag([a, tmp_path / "missing.py"]) is None


def test_a_reference_key_holds_every_part_that_decides_a_case():
    p = get_problem("softmax")
    args = dict(problem=p, shape=p.cpu_shape, outputs=("y",), cpu_mode=True, inputs_tag="g1", baseline="torch",
                device="cpu")
    base = reference_key(**args)
    assert {"torch", "triton", "fla", "code", "inputs", "device", "baseline", "params"} <= set(base)
    for part, other in [("shape", p.shapes[0]), ("outputs", ("z",)), ("cpu_mode", False), ("inputs_tag", "g2"),
                        ("baseline", "other"), ("device", "NVIDIA H200")]:
        assert reference_key(**{**args, part: other}) != base, part
    assert reference_key(**{**args, "problem": get_problem("kda"), "shape": get_problem("kda").cpu_shape}) != base
    assert reference_key(**{**args, "inputs_tag": None}) is None  # an unknown generator: nothing cached
    from baselines.problem import RANDOM_SHAPE, Shape

    assert reference_key(**{**args, "shape": Shape(RANDOM_SHAPE + "N=3", {"N": 3})}) is None
    # versions are part of it: another torch is another key
    c = ReferenceCaseCache(Path("/nonexistent"), base, None)
    assert c.key("unit", 1) != {**c.key("unit", 1), "torch": "0.0"}


def test_a_settings_cache_dir_defaults_to_the_home():
    s = GpuWorkerSettings.from_env({"MARATHON_HOME": "/h"})
    assert str(s.cache_dir) == "/h/cache"
    assert str(GpuWorkerSettings.from_env({"MARATHON_HOME": "/h", "MARATHON_CACHE_DIR": "/c"}).cache_dir) == "/c"


# --- a restarted reference reads what its predecessor computed -------------------------------------

def _reference_run(settings, cases, baseline=True):
    """A fresh reference child (a new process, as after a worker's restart): setup, staging, the cases."""
    from gpu_worker import protocol as msg
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("reference", interpreter=True, settings=settings)
    try:
        def call(req, timeout=300):
            r = sb.call(req, timeout)
            assert r.ok, r.failure
            return r.result

        call(msg.Setup(problem="softmax", shape=None))
        t0 = time.perf_counter()
        call(msg.Stage(cases=cases))
        res = call(msg.Reference(cases=cases, baseline=baseline))
        seconds = time.perf_counter() - t0
    finally:
        sb.close(graceful=True)
    return res.cases, seconds


def test_a_cached_case_without_the_baselines_error_does_not_answer_one_that_asks_for_it(tmp_path):
    s = GpuWorkerSettings(cache_dir=tmp_path / "cache", gpu_workdir=tmp_path / "work")
    cases = [(get_problem("softmax").distributions[0], 5)]
    first, _ = _reference_run(s, cases, baseline=False)
    assert math.isnan(first[0].baseline_err) and len(list((tmp_path / "cache" / "oracles").glob("*.entry"))) == 1
    full, _ = _reference_run(s, cases, baseline=True)  # computed again, with the baseline, and kept so
    assert "cached" not in full[0].timing and not math.isnan(full[0].baseline_err)
    assert full[0].hash == first[0].hash


def test_the_cache_is_never_written_by_a_candidate_child():
    """Candidates compile into their own Triton cache; the oracle cache lives outside every write root."""
    from gpu_worker.sandbox import triton_env

    env = triton_env("candidate", "/tmp/c", GpuWorkerSettings(cache_dir="/cache"), False)
    assert not env["TRITON_CACHE_DIR"].startswith("/cache")
    assert json.dumps(env)


# --- a restarted worker: its warm-up, its self-test ------------------------------------------------

def _evaluator(store, tmp_path, **settings):
    from gpu_worker.harness import Evaluator
    from gpu_worker.device.scheduling import Scheduler

    s = GpuWorkerSettings(cache_dir=tmp_path / "cache", gpu_workdir=tmp_path / "work", **settings)
    return Evaluator(store=store, interpreter=True, scheduler=Scheduler(spares=0), settings=s)


def _case(entry: Path) -> tuple:
    """(distribution's place, seed) of a reference case's cache entry, from the key in its header."""
    with open(entry, "rb") as f:
        f.readline()
        key = json.loads(f.readline())["key"]
    return get_problem("softmax").distributions.index(key["dist"]), key["seed"]


def test_a_restarted_worker_warms_from_the_cache_and_rebuilds_a_corrupt_entry(store, tmp_path):
    """The oracle bank of softmax's whole seed pool, computed by one worker and read by the next (a new
    worker process builds the same Evaluator: a new reference child, nothing kept in memory), but for the
    entry corrupted in between, which is computed again, logged once, and written anew."""
    runs = []
    for restart in range(2):
        if restart:
            # the last case warmed: never the restarted child's first, which is computed again anyway (an
            # entry's file name is its key's digest, and the key holds the problem's code: no fixed order)
            entries = sorted((tmp_path / "cache" / "oracles").glob("*.entry"), key=_case)
            assert len(entries) == runs[0][2]
            raw = entries[-1].read_bytes()
            entries[-1].write_bytes(raw[:-5] + bytes(5))
        ev = _evaluator(store, tmp_path)
        try:
            t0 = time.perf_counter()
            w = ev.warm("softmax")
            meta = {k: (m.hash, m.baseline_err, "cached" in m.timing) for k, m in ev.refs.meta.items()}
            runs.append((time.perf_counter() - t0, w["parts"], w["oracles"], meta))
        finally:
            ev.close()
    (t_cold, cold, n, first), (t_warm, warm, _, second) = runs
    assert n == 16 * len(get_problem("softmax").distributions)
    assert "oracles.cached" not in cold and not any(c for _, _, c in first.values())
    # computed again: the corrupt entry, and the restarted child's first case (its baseline's first call)
    assert sorted(c for _, _, c in second.values()) == [False] * 2 + [True] * (n - 2)
    assert {k: v[:2] for k, v in second.items()} == {k: v[:2] for k, v in first.items()}
    print(f"softmax warm-up, {n} cases: {t_cold:.2f} s cold (oracles {cold['oracles']} s), "
          f"{t_warm:.2f} s restarted (oracles {warm['oracles']} s, {n - 2} from the cache)")


def test_a_restarted_worker_reuses_a_passing_self_test(store, tmp_path):
    """A pass kept by an earlier start settles a new worker's verdict at once (the canaries' own run is
    test_activities'; here the record is the one Evaluator.selftest stores after them)."""
    from gpu_worker.selftest_verdict import SelfTestRecord

    kept = {"ok": True, "problems": [], "canaries": {"slow": {"compile_ok": True, "verify_ok": True}},
            "ranking": "skipped", "timing": "skipped", "interpreter": True, "seconds": 61.0}
    ev = _evaluator(store, tmp_path)
    try:
        SelfTestRecord(ev.settings, ev.cuda).store(kept)
    finally:
        ev.close()
    ev = _evaluator(store, tmp_path)  # the restart: a new Evaluator, nothing in memory
    try:
        t0 = time.perf_counter()
        again = ev.selftest(reuse=True)
        assert time.perf_counter() - t0 < 5  # the canaries would take a minute or more here
        assert again["reused_from"] and ev.selftest_verdict.passed
        assert {k: v for k, v in again.items() if k != "reused_from"} == kept
    finally:
        ev.close()
    # another judging setting is another key: its worker runs the canaries
    other = _evaluator(store, tmp_path, bench_reps=7)
    try:
        assert SelfTestRecord(other.settings, other.cuda).load() is None
    finally:
        other.close()


def test_a_self_test_record_is_keyed_checked_and_never_keeps_a_failure(tmp_path):
    from gpu_worker.selftest_verdict import SelfTestRecord, selftest_key

    s = GpuWorkerSettings(cache_dir=tmp_path / "cache")
    rec = SelfTestRecord(s, False)
    rec.store({"ok": False, "problems": ["x"]})
    assert rec.load() is None
    rec.store({"ok": True, "problems": []})
    assert rec.load()["ok"]
    # settings that judge are part of the key; where files go is not
    assert selftest_key(s.model_copy(update={"bench_reps": 7}), False) != rec.key
    assert selftest_key(s.model_copy(update={"wall": "off"}), False) != rec.key
    assert selftest_key(s.model_copy(update={"gpu_workdir": tmp_path}), False) == rec.key
    assert selftest_key(s, True) != rec.key or selftest_key(s, True) is None  # the device is
    # stale: older than its age limit
    assert SelfTestRecord(s, False, max_age_s=-1).load() is None
    # corrupt: rebuilt (read as absent, the canaries run again)
    path = rec.disk.path(rec.key)
    path.write_bytes(path.read_bytes().replace(b'"ok": true', b'"ok": fals'))
    assert rec.load() is None and not path.exists()


def test_warming_other_shapes_leaves_their_children_closed_but_one(store, tmp_path):
    p = get_problem("softmax")
    ev = _evaluator(store, tmp_path)
    try:
        out = ev.warm_shapes("softmax", [p.cpu_shape.name], keep=None)
        assert out[0]["oracles"] == len(p.distributions) and out[0]["parts"]["cached"] == 0 and not ev.refs.children
    finally:
        ev.close()
    ev = _evaluator(store, tmp_path)  # restarted
    try:
        out = ev.warm_shapes("softmax", [p.cpu_shape.name], keep=p.cpu_shape.name)
        # the first worker's, read back, but the first case: a new child's baseline runs once
        assert out[0]["parts"]["cached"] == len(p.distributions) - 1
        assert list(ev.refs.children) == [("softmax", p.cpu_shape.name)]
    finally:
        ev.close()


def test_a_temp_file_left_by_a_killed_writer_is_removed_once_old(tmp_path):
    c = DiskCache(tmp_path, "t", max_bytes=1 << 20)
    c.dir.mkdir(parents=True)
    old, new = c.dir / ".tmp-old", c.dir / ".tmp-new"
    for p in (old, new):
        p.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    c.put(KEY, b"x")
    assert not old.exists() and new.exists()  # a writer may still be busy with the recent one


def test_the_ceilings_are_kept_per_gpu_model_host_and_versions(tmp_path):
    """The reference child's ceilings entry (measured on CUDA only; the key and the entry are the CPU's part)."""
    from gpu_worker.caches import ceilings_key

    h100, h200 = ceilings_key("NVIDIA H100 80GB HBM3"), ceilings_key("NVIDIA H200")
    assert h100 != h200 and {"host", "torch", "cuda", "device"} <= set(h100)
    c = DiskCache(tmp_path, "ceilings")
    c.put_json(h200, {"bandwidth": 4.1e12, "flops": 7.2e14})
    assert c.get_json(h200) == {"bandwidth": 4.1e12, "flops": 7.2e14} and c.get_json(h100) is None


def _triton_entry(root, key: str, name: str, group: bool = True) -> None:
    """A compiled kernel's entry as Triton's file cache writes it: its files, and a group naming them by
    absolute path."""
    d = root / key
    d.mkdir(parents=True)
    files = {f"{name}.cubin": d / f"{name}.cubin", f"{name}.json": d / f"{name}.json"}
    for f in files.values():
        f.write_text(f"{key} {f.name}")
    if group:
        (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {k: str(v) for k, v in files.items()}}))


def test_a_candidate_child_s_cache_gets_the_harness_s_kernels_from_the_trusted_one(tmp_path):
    """The refill's compiled kernels are copied, their group naming the copy's files (Triton's own reader
    finds them there); a candidate's or a library's kernel is not, nor an entry without its group, nor one
    the child's cache has already."""
    from triton.runtime.cache import FileCacheManager

    from gpu_worker.caches import seed_harness_kernels

    trusted, own = tmp_path / "trusted", tmp_path / "own"
    own.mkdir()
    _triton_entry(trusted, "aaa", "_perturb_elementwise")
    _triton_entry(trusted, "bbb", "_perturb_rows")
    _triton_entry(trusted, "ccc", "chunk_kda_fwd")  # the baseline's: never the candidate's
    _triton_entry(trusted, "ddd", "_perturb_elementwise", group=False)  # half-written: nothing to trust
    _triton_entry(own, "bbb", "_perturb_rows")
    (own / "bbb" / "_perturb_rows.cubin").write_text("the child's own")
    assert seed_harness_kernels(own, trusted) == 1
    assert sorted(p.name for p in own.iterdir()) == ["aaa", "bbb"]
    assert (own / "bbb" / "_perturb_rows.cubin").read_text() == "the child's own"
    import triton

    saved = triton.knobs.cache.dir
    triton.knobs.cache.dir = str(own)
    try:
        group = FileCacheManager("aaa").get_group("_perturb_elementwise.json")
    finally:
        triton.knobs.cache.dir = saved
    assert group and all(Path(p).parent == own / "aaa" for p in group.values()), group
    assert Path(group["_perturb_elementwise.cubin"]).read_text() == "aaa _perturb_elementwise.cubin"
    assert seed_harness_kernels(own, trusted) == 0  # copied once
