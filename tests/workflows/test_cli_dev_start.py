"""Starting the dev server: waiting for its port never leaves a server behind, whatever the address."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

import cli.server as server
from cli.errors import UsageError

#: a stand-in for the temporal binary that never listens
NEVER_LISTENS = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_port_open_answers_false_for_a_host_that_does_not_resolve():
    assert server.port_open("300.0.0.0", 7233) is False


def test_port_open_finds_an_ipv6_listener():
    try:
        s = socket.socket(socket.AF_INET6)
        s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with s:
        s.listen(1)
        assert server.port_open("::1", s.getsockname()[1])


def started(monkeypatch) -> list[subprocess.Popen]:
    """The processes start_dev_server starts, with the stand-in in place of the temporal binary."""
    procs, popen = [], subprocess.Popen

    def record(*args, **kw):
        procs.append(popen(*args, **kw))
        return procs[-1]

    monkeypatch.setattr(server, "dev_server_args", lambda *a, **k: NEVER_LISTENS)
    monkeypatch.setattr(server.subprocess, "Popen", record)
    return procs


def test_a_failed_wait_for_the_port_stops_the_server_it_started(tmp_path, monkeypatch):
    procs = started(monkeypatch)

    def broken(host, port):
        raise socket.gaierror(-9, "Address family for hostname not supported")

    monkeypatch.setattr(server, "port_open", broken)
    with pytest.raises(OSError):
        server.start_dev_server(7999, 8999, tmp_path / "t.db", ip="::1")
    assert len(procs) == 1 and procs[0].poll() is not None, "the server was left running"
    # and its lock went with it: another server may use the database
    os.close(server.lock_database(tmp_path / "t.db"))


def test_a_server_that_exits_before_listening_is_one_line_naming_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "dev_server_args", lambda *a, **k: [sys.executable, "-c", "raise SystemExit(3)"])
    log = tmp_path / "dev-server.log"
    with pytest.raises(UsageError, match=f"the dev server exited with status 3; see {log}"):
        server.start_dev_server(7999, 8999, tmp_path / "t.db", log=log)
