"""Sandbox children forked from a process with torch and Triton imported (gpu_worker.forkserver): each is
the process Popen would have made, no descriptor of anyone else's, and its end is reported."""

import json
import os
import signal
import time

import pytest

from gpu_worker import forkserver
from gpu_worker.forkserver import ForkedProcess, start_child

PROBE = "tests.gpu_worker.forked_probe"


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {**env, "PYTHONPATH": root, "TRITON_INTERPRET": "1", **extra}


def _report(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "the child wrote no report"
        time.sleep(0.05)
    return json.loads(path.read_text())


@pytest.mark.slow(15)
def test_a_forked_child_is_the_process_popen_would_make(tmp_path):
    r, w = os.pipe()
    other_r, other_w = os.pipe()  # the worker's, not passed: the child must not hold it
    env = _env(MARATHON_PROBE="x y", TMPDIR=str(tmp_path))
    try:
        proc = start_child([PROBE, str(tmp_path / "a.json"), "7", str(w)], env, str(tmp_path), (r, w))
        assert isinstance(proc, ForkedProcess)
        assert proc.wait(60) == 7 and proc.poll() == 7
        rep = _report(tmp_path / "a.json")
    finally:
        for fd in (r, w, other_r, other_w):
            os.close(fd)
    assert rep["preloaded"], "torch was not imported before the child's module ran"
    assert rep["argv"] == [str(tmp_path / "a.json"), "7", str(w)]
    assert rep["env"] == env and rep["cwd"] == str(tmp_path) == rep["path0"]
    assert rep["sid"] == rep["pid"] == proc.pid and rep["stdin"] == "/dev/null"
    assert rep["fds"] == sorted({0, 1, 2, r, w})  # its own descriptors at their numbers, nothing else


@pytest.mark.slow(20)
def test_children_at_once_hold_none_of_each_others_descriptors_and_a_kill_is_reported(tmp_path):
    pipes = [os.pipe() for _ in range(2)]
    try:
        first = start_child([PROBE, str(tmp_path / "1.json"), "wait"], _env(), str(tmp_path), pipes[0])
        rep1 = _report(tmp_path / "1.json")
        second = start_child([PROBE, str(tmp_path / "2.json"), "0"], _env(), str(tmp_path), pipes[1])
        rep2 = _report(tmp_path / "2.json")
        assert second.wait(60) == 0
        assert rep2["fds"] == sorted({0, 1, 2, *pipes[1]})  # none of the first child's
        assert first.poll() is None
        with pytest.raises(Exception):
            first.wait(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL
        assert rep1["pid"] != rep2["pid"]
    finally:
        for p in pipes:
            for fd in p:
                os.close(fd)


@pytest.mark.slow(20)
def test_the_import_environment_picks_the_server_and_a_dead_server_is_replaced(tmp_path):
    compiled = start_child([PROBE, str(tmp_path / "c.json"), "0"], _env(TRITON_INTERPRET="0"), str(tmp_path), ())
    assert compiled.wait(60) == 0 and not _report(tmp_path / "c.json")["interpret"]
    interpreted = start_child([PROBE, str(tmp_path / "i.json"), "0"], _env(), str(tmp_path), ())
    assert interpreted.wait(60) == 0 and _report(tmp_path / "i.json")["interpret"]
    server = forkserver._servers[forkserver.import_key(_env())]
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    again = start_child([PROBE, str(tmp_path / "again.json"), "3"], _env(), str(tmp_path), ())
    assert again.wait(60) == 3 and _report(tmp_path / "again.json")["preloaded"]
    assert forkserver._servers[forkserver.import_key(_env())] is not server


@pytest.mark.slow(10)
def test_a_child_killed_as_soon_as_it_is_started_is_gone_and_reported(tmp_path):
    # the reply comes once the child leads its own process group, so its group can be killed at once
    for n in range(3):
        proc = start_child([PROBE, str(tmp_path / f"{n}.json"), "wait"], _env(), str(tmp_path), ())
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL


@pytest.mark.slow(15)
def test_a_worker_that_is_gone_takes_its_children_with_it(tmp_path):
    """A child that never reads its pipe again (a candidate's endless loop) does not outlive its worker: the
    fork server, seeing the worker's socket close, ends its children's process groups before it exits."""
    env = _env(MARATHON_PROBE="orphan")
    proc = start_child([PROBE, str(tmp_path / "o.json"), "wait"], env, str(tmp_path), ())
    pid = _report(tmp_path / "o.json")["pid"]
    key = forkserver.import_key(env)
    server = forkserver._servers.pop(key)
    server.close()  # what the kernel does to the socket of a worker that was killed
    assert server.proc.wait(30) == 0
    deadline = time.monotonic() + 15
    while forkserver._pid_alive(pid):
        assert time.monotonic() < deadline, "the child outlived its fork server"
        time.sleep(0.1)
    assert proc.wait(5) == -signal.SIGTERM
