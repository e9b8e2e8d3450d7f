"""The server `make run` (`marathon demo`) and `marathon dev` run on: the demo waits for the server's health, not
its port, and stops a server it started that never becomes healthy; its ports are chosen; an address given is
used and nothing is started; a port someone else holds is said, or refused."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from cli import main
from cli.errors import UsageError
from cli.server import connect_when_healthy, demo_server, port_open, start_dev_server, stop_server, ui_port_of
from tests.workflows.test_cli import MARATHON, free_port


class SilentListener:
    """A TCP listener on a port that accepts connections and answers nothing (not a Temporal server)."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))  # 0: a free port of its own, no race with other processes
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted, self.conns = 0, []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept in the thread: close alone leaves it listening
        except OSError:
            pass
        self.sock.close()
        self.thread.join(timeout=5)
        for c in self.conns:
            c.close()


#: a stand-in for the dev server binary: listens on the port it is given and never speaks gRPC
SILENT_SERVER = ("import socket, sys, time\ns = socket.socket()\n"
                 "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(16)\nconns = []\n"
                 "while True:\n    conns.append(s.accept())\n")


async def test_the_client_waits_for_a_server_slow_to_become_healthy_and_the_demo_reuses_it(tmp_path):
    """First a listener that accepts and never answers holds the port (a server not healthy yet), then the real
    dev server starts there: the connection is tried again until the server answers as healthy. A later demo
    finds that server through its database's lock and reuses it, with its Web UI's address."""
    fake = SilentListener()
    port, ui = fake.port, [0]
    db, log = tmp_path / "temporal.db", tmp_path / "dev-server.log"
    started: list[subprocess.Popen] = []

    def server_later():
        time.sleep(2.0)
        fake.close()
        for _ in range(3):  # a free Web UI port can be taken by another process before the server binds it
            ui[0] = free_port()
            try:
                started.append(start_dev_server(port, ui[0], db, log=log))
                return
            except UsageError:
                continue

    later = threading.Thread(target=server_later)
    later.start()
    try:
        client = await connect_when_healthy(f"127.0.0.1:{port}", timeout=120)
        assert await client.service_client.check_health()
        assert fake.accepted >= 1, "the first tries met the listener that never answers"
        later.join()
        again, server, ui_url, said = await demo_server(None, None, port, ui[0], db, log)
        assert server is None and ui_url == f"http://localhost:{ui[0]}"
        assert said == f"reusing the dev server already running on port {port} (pid {started[0].pid}, database {db})"
    finally:
        later.join()
        fake.close()
        for proc in started:
            stop_server(proc)


def test_the_demo_stops_a_server_it_started_that_never_becomes_healthy(tmp_path, monkeypatch, capsys):
    import cli.demo
    import cli.server

    port = free_port()
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "none.toml"))  # no profile names a server
    monkeypatch.setattr(cli.demo, "HOME", tmp_path)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the demo's SIGTERM handler stays out of pytest
    monkeypatch.setattr(cli.server, "HEALTH_TIMEOUT_S", 3.0)
    monkeypatch.setattr(cli.server, "dev_server_args",
                        lambda port, *a, **kw: [sys.executable, "-c", SILENT_SERVER, str(port)])
    rc = main(["demo", "softmax", "--iterations", "1", "--port", str(port), "--ui-port", str(free_port())])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"marathon: error: the Temporal server at 127.0.0.1:{port} did not answer as healthy "
                             f"within 3 s ("), err
    assert not port_open("127.0.0.1", port), "the server the demo started is stopped"
    from cli.server import lock_holder

    assert lock_holder(tmp_path / "temporal.db") is None  # and its database is free


@pytest.mark.parametrize("case", ["address", "port", "ui-port"])
def test_the_demo_uses_the_address_given_and_refuses_ports_held_by_others(tmp_path, monkeypatch, capsys, case):
    """TEMPORAL_ADDRESS names a server: the demo uses it and starts none (here it is unreachable: one line). A
    port held by something that is not a Temporal server, or a Web UI port held, is refused in one line."""
    import cli.demo
    import cli.server

    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "none.toml"))
    monkeypatch.setattr(cli.demo, "HOME", tmp_path)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # the demo's SIGTERM handler stays out of pytest
    monkeypatch.setattr(cli.server, "ADDRESS_TIMEOUT_S", 2.0)
    held = None if case == "address" else SilentListener()
    port = held.port if case == "port" else free_port()
    ui = held.port if case == "ui-port" else free_port()
    if case == "address":
        monkeypatch.setenv("TEMPORAL_ADDRESS", "127.0.0.1:1")
    else:
        monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    t0 = time.monotonic()
    try:
        rc = main(["demo", "softmax", "--iterations", "1", "--port", str(port), "--ui-port", str(ui)])
    finally:
        if held:
            held.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    expected = {"address": "marathon: error: the Temporal server at 127.0.0.1:1 did not answer as healthy within 2 s "
                           "(connection refused)",
                "port": f"marathon: error: port {port} is in use by something that answers not as a Temporal server",
                "ui-port": f"marathon: error: Web UI port {ui} is in use: choose another with --ui-port "
                           f"(make run UI_PORT=...)"}[case]
    assert err[0].startswith(expected), err
    assert time.monotonic() - t0 < 20
    assert not port_open("127.0.0.1", port) and not (tmp_path / "temporal.db").exists(), "no server was started"


async def test_a_temporal_server_someone_else_holds_on_the_port_is_said_to_be_used(env, tmp_path):
    port = int(env.client.service_client.config.target_host.rsplit(":", 1)[1])
    client, server, ui, said = await demo_server(None, None, port, free_port(), tmp_path / "temporal.db",
                                                 tmp_path / "log")
    assert server is None and ui is None and await client.service_client.check_health()
    assert said.startswith(f"port {port} is held by a Temporal server this demo did not start: the run goes there; "
                           f"choose another port with --port (make run PORT=...)")


def test_marathon_dev_prints_the_web_ui_on_the_port_it_serves(tmp_path):
    port, ui = free_port(), free_port()
    assert ui_port_of(7300, None) == 8300 and ui_port_of(7300, 9000) == 9000  # the temporal CLI's default
    proc = subprocess.Popen(MARATHON + ["dev", "--db", str(tmp_path / "t.db"), "--port", str(port),
                                        "--ui-port", str(ui)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"Temporal dev server on 127.0.0.1:{port}")
        assert proc.stdout.readline().strip() == f"Web UI: http://localhost:{ui}"
        deadline = time.monotonic() + 60
        while not port_open("127.0.0.1", ui):  # the UI server may start a moment after the frontend
            assert time.monotonic() < deadline, "the Web UI is not on the port printed"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert not port_open("127.0.0.1", port)  # SIGTERM stopped the server too, not only `marathon dev`
    # a Web UI port already held is refused before a server starts
    import argparse

    from cli.server import cmd_dev

    held = SilentListener()
    ui = held.port
    try:
        with pytest.raises(UsageError, match=f"Web UI port {ui} is already in use .*: choose another with --ui-port"):
            asyncio.run(cmd_dev(argparse.Namespace(db=str(tmp_path / "u.db"), port=free_port(), ui_port=ui,
                                                   ip="127.0.0.1", headless=False)))
    finally:
        held.close()


def test_the_demos_worker_warms_the_runs_built_in_problem_unless_told_otherwise():
    from cli.demo import worker_env
    from gpu_worker.worker import warm_list

    env = worker_env("kda", {"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["MARATHON_SHUTDOWN_GRACE_S"] == "20"
    assert warm_list(env["MARATHON_WARM_PROBLEM"]) == [("kda", None)]  # as the worker reads it
    assert "MARATHON_WARM_PROBLEM" not in worker_env("file:0123abcd", {})  # a file problem: no warm-up named
    mine = worker_env("kda", {"MARATHON_WARM_PROBLEM": "", "MARATHON_SHUTDOWN_GRACE_S": "5"})
    assert mine["MARATHON_WARM_PROBLEM"] == "" and mine["MARATHON_SHUTDOWN_GRACE_S"] == "5"
