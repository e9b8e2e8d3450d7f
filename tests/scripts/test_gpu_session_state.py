"""gpu_session.py's saved state (--keep-running / --resume): what goes in comes back, bad input is refused."""

import json
import tarfile

import pytest


@pytest.fixture()
def session(tmp_path, monkeypatch, load_script):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    mod = load_script("gpu_session")
    mod.WORK = tmp_path / "work"
    mod.OUT = tmp_path / "out"
    mod.WORK.mkdir()
    mod.OUT.mkdir()
    return mod


def test_state_round_trip(session):
    (session.WORK / "temporal.db").write_bytes(b"sqlite")
    (session.WORK / "artifacts" / "objects").mkdir(parents=True)
    (session.WORK / "artifacts" / "objects" / "x").write_text("kernel")
    session.save_state({"kda": "h200-kda-1"})
    for p in ("temporal.db", "artifacts", "runs.json"):
        path = session.WORK / p
        path.unlink() if path.is_file() else __import__("shutil").rmtree(path)
    assert session.restore_state(session.OUT / "state.tar.gz") == {"kda": "h200-kda-1"}
    assert (session.WORK / "temporal.db").read_bytes() == b"sqlite"
    assert (session.WORK / "artifacts" / "objects" / "x").read_text() == "kernel"


def test_a_fresh_session_forgets_the_runs_an_earlier_one_left(session):
    """Without --resume the dev server starts on an empty history (an unfinished run would go on beside the
    new one); the caches under home and the artifacts stay."""
    for name, data in (("temporal.db", b"sqlite"), ("runs.json", b"{}")):
        (session.WORK / name).write_bytes(data)
    (session.WORK / "home" / "cache").mkdir(parents=True)
    (session.WORK / "artifacts").mkdir()
    assert session.forget_runs() == {}
    assert sorted(p.name for p in session.WORK.iterdir()) == ["artifacts", "home"]
    assert (session.WORK / "home" / "cache").is_dir()


def test_resume_refuses_what_is_not_a_state(session, tmp_path):
    with pytest.raises(SystemExit, match="is not a file"):
        session.restore_state(tmp_path / "missing.tar.gz")
    bad = tmp_path / "bad.tar.gz"
    (tmp_path / "runs.json").write_text(json.dumps({}))
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(tmp_path / "runs.json", arcname="runs.json")
    with pytest.raises(SystemExit, match="no temporal.db"):
        session.restore_state(bad)


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "2", "--devices", "1"], "--devices: 2 distinct device numbers"),
    (["--devices", "x"], "--devices: comma-separated device numbers"),
    (["--gpus", "2", "--devices", "1,1"], "--devices: 2 distinct"),
    (["--split", "--queues", "a,b"], "--queues: 1 distinct task queue names"),
    (["--split", "--queues", "bad queue"], "--queues: 1 distinct task queue names"),
    (["--queues", "marathon-gpu-1"], "--queues: only with --split"),
    (["--problems", "kda", "--fresh", "mla_prefill"], "--fresh: ['mla_prefill'] not in --problems"),
    (["--bench", "kda|mla_decode"], "--bench: at most one group per GPU"),
])
def test_session_arguments_refused_with_one_line(session, monkeypatch, capsys, argv, message):
    # refused before anything starts: no dev server, no worker, nothing written to the work dir
    monkeypatch.setattr("sys.argv", ["gpu_session.py", *argv])
    with pytest.raises(SystemExit) as e:
        session.main()
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not any(session.WORK.iterdir())


def test_throughput_of_a_run_left_going_counts_its_recorded_iterations(load_script):
    # a --keep-running run has no ledger records since its last compaction: the status samples still count
    samples = [{"t": 100.0 + 10 * k, "busy": {"gpu0": 5.0 * k}, "timed": {"gpu0": 1.0 * k},
                "runs": {"kda": {"iteration": 40 + 3 * k}}} for k in range(13)]
    results = load_script("session_results")
    out = results.throughput([], [{"name": "gpu0", "since": 100.0}], 100.0, samples, "kda", smi=[], cpu=[])
    w = out["windows"][0]
    assert w["evaluations"] == 0 and w["recorded"] == 36
    assert abs(w["recorded_per_hour"] - 36 / 120 * 3600) < 1e-6
    assert abs(w["busy_fraction"]["gpu0"] - 0.5) < 1e-9


def test_resumed_run_gets_the_sessions_iteration_budget(session):
    # the status a resumed run reports (`marathon status --json`): its budget comes from its spec
    st = {"phase": "benchmarking", "budget": {"iterations": 1000, "hours": 8.0}}
    assert session.iterations_to_raise(st, 1200) == 1200
    assert session.iterations_to_raise(st, 1000) is None
    assert session.iterations_to_raise(st, 800) is None  # never lowered here
    assert session.iterations_to_raise({"phase": "x", "budget": {"iterations": None}}, 1200) is None  # unlimited
    assert session.iterations_to_raise({}, 1200) is None  # no status: nothing to change
