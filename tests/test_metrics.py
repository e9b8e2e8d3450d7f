"""Prometheus metrics, scraped over real HTTP: the Temporal SDK endpoint of a runtime that served a
real worker on the dev server, and the project's counters on the neighbouring port."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
import uuid
from datetime import timedelta

import time

import pytest
from temporalio import activity
from temporalio.worker import Worker

from workflows import metrics
from tests.conftest import temporal_path


def free_port_pair() -> int:
    """A port P with P and P+1 both free right now."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            if p >= 65534:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
        return p
    raise RuntimeError("no free pair of ports")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        return r.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format, or None when absent."""
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        metric, _, rest = series.partition("{")
        if metric != name:
            continue
        got = dict(kv.split("=", 1) for kv in rest.rstrip("}").split(",") if kv) if rest else {}
        got = {k: v.strip('"') for k, v in got.items()}
        if all(got.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


@activity.defn(name="metrics_probe")
async def metrics_probe(x: int) -> int:
    return x + 1


async def test_temporal_runtime_serves_sdk_metrics_of_a_real_worker():
    from temporalio.testing import WorkflowEnvironment

    port = free_port_pair()
    rt = metrics.temporal_runtime(port, "127.0.0.1", {"marathon_role": "test"})
    env = await WorkflowEnvironment.start_local(runtime=rt, dev_server_existing_path=temporal_path())
    try:
        queue = f"metrics-{uuid.uuid4().hex[:8]}"
        async with Worker(env.client, task_queue=queue, activities=[metrics_probe]):
            await asyncio.sleep(1.0)  # pollers up
            text = await asyncio.to_thread(scrape, port)
    finally:
        await env.shutdown()
    assert "temporal_" in text
    assert sample(text, "temporal_request", marathon_role="test") is not None, text[:2000]
    assert any(line.startswith("temporal_worker_task_slots_available") and f'task_queue="{queue}"' in line
               for line in text.splitlines()), text[:2000]


def test_temporal_runtime_without_port_is_the_default():
    from temporalio.runtime import Runtime

    assert metrics.temporal_runtime(None) is Runtime.default()


def test_taken_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(metrics.MetricsConfigError, match="cannot serve Temporal metrics"):
            metrics.temporal_runtime(taken, "127.0.0.1")


def test_port_parsing(monkeypatch):
    monkeypatch.delenv(metrics.PORT_ENV, raising=False)
    assert metrics.metrics_port() is None
    monkeypatch.setenv(metrics.PORT_ENV, " ")
    assert metrics.metrics_port() is None
    monkeypatch.setenv(metrics.PORT_ENV, "9464")
    assert metrics.metrics_port() == 9464
    assert metrics.metrics_port(9000) == 9000
    for bad in ("x", "0", "65535"):
        monkeypatch.setenv(metrics.PORT_ENV, bad)
        with pytest.raises(metrics.MetricsConfigError):
            metrics.metrics_port()


def test_bad_label_values_are_refused():
    with pytest.raises(ValueError):
        metrics.count_evaluation("accepted")
    with pytest.raises(ValueError):
        metrics.count_evaluation("rejected")  # a rejection needs its stage
    with pytest.raises(ValueError):
        metrics.count_evaluation("rejected", "lint")
    with pytest.raises(ValueError):
        metrics.add_gpu_busy(-1.0)


def test_project_counters_scraped_after_increments(monkeypatch):
    pytest.importorskip("prometheus_client")
    port = free_port_pair()
    monkeypatch.setenv(metrics.PORT_ENV, str(port))
    m = metrics.setup_metrics(host="127.0.0.1", role="gpu", install_default=False)
    try:
        assert (m.temporal_port, m.counters_port) == (port, port + 1)
        assert "marathon counters on" in m.describe()
        before = scrape(port + 1)
        # every label value is there from the start, at its current value
        for outcome in metrics.OUTCOMES:
            assert sample(before, "marathon_evaluations_total", outcome=outcome) is not None
        for stage in metrics.STAGES:
            assert sample(before, "marathon_rejections_total", stage=stage) is not None
        ev0 = sample(before, "marathon_evaluations_total", outcome="rejected")
        rej0 = sample(before, "marathon_rejections_total", stage="verify")
        pas0 = sample(before, "marathon_evaluations_total", outcome="passed")
        gpu0 = sample(before, "marathon_gpu_busy_seconds_total")

        metrics.count_evaluation("rejected", "verify")
        metrics.count_evaluation("rejected", "verify")
        metrics.count_evaluation("passed")
        metrics.add_gpu_busy(1.25)
        metrics.add_gpu_busy(0.5)

        after = scrape(port + 1)
        assert sample(after, "marathon_evaluations_total", outcome="rejected") == ev0 + 2
        assert sample(after, "marathon_rejections_total", stage="verify") == rej0 + 2
        assert sample(after, "marathon_evaluations_total", outcome="passed") == pas0 + 1
        assert sample(after, "marathon_gpu_busy_seconds_total") == pytest.approx(gpu0 + 1.75)
        assert "process_cpu_seconds_total" in after or "python_info" in after
        # the Temporal endpoint of the same setup answers too (no client yet: it may be empty)
        scrape(port)
    finally:
        m.close()


def test_observe_report_counts_gpu_worker_reports():
    pytest.importorskip("prometheus_client")
    from workflows.contracts import BenchReport, CompileReport, VerifyReport

    port = free_port_pair()
    server = metrics.start_counters_server(port, "127.0.0.1")
    try:
        before = scrape(port)
        metrics.observe_report("compile", CompileReport(ok=False, error="syntax"))
        metrics.observe_report("verify", VerifyReport(ok=False, stage="sandbox", reason="timeout"))
        metrics.observe_report("verify", VerifyReport(ok=True))  # not finished yet: not counted
        metrics.observe_report("benchmark", BenchReport(ok=True, gpu_seconds=2.0))
        from gpu_worker.device.owner import DeviceOwner

        owner = DeviceOwner()
        with owner.timing():
            time.sleep(0.2)
        after = scrape(port)
    finally:
        server.shutdown()
        server.server_close()

    def delta(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("marathon_rejections_total", stage="compile") == 1
    assert delta("marathon_rejections_total", stage="sandbox") == 1
    assert delta("marathon_evaluations_total", outcome="rejected") == 2
    assert delta("marathon_evaluations_total", outcome="passed") == 1
    # busy time comes from the device owner's turns (untimed jobs and timing alike), not from reports
    assert delta("marathon_gpu_busy_seconds_total") == pytest.approx(owner.busy_s)
    assert delta("marathon_gpu_timed_seconds_total") == pytest.approx(owner.timed_s)
    assert delta("marathon_gpu_closed_seconds_total") == pytest.approx(owner.closed_s)
    assert owner.busy_s >= 0.2 and owner.timed_s >= 0.2 and owner.closed_s >= 0.2


def test_setup_metrics_as_default_runtime_for_workflows_client_connect(tmp_path):
    """The wiring a worker uses: setup_metrics() before workflows.client.connect() (no runtime argument),
    in a fresh process because it installs the process-wide default runtime."""
    pytest.importorskip("prometheus_client")
    import subprocess
    import sys
    import textwrap

    port = free_port_pair()
    script = textwrap.dedent(f"""
        import asyncio, os, sys, urllib.request
        from temporalio.testing import WorkflowEnvironment
        from workflows import metrics
        from workflows.client import connect

        async def main():
            m = metrics.setup_metrics({port}, host="127.0.0.1", role="agent")
            print(m.describe())
            env = await WorkflowEnvironment.start_local(dev_server_existing_path={temporal_path()!r})
            try:
                client = await connect(env.client.service_client.config.target_host)
                await client.count_workflows()
                metrics.count_evaluation("rejected", "rules")
                sdk = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                app = urllib.request.urlopen("http://127.0.0.1:{port + 1}/metrics", timeout=5).read().decode()
            finally:
                await env.shutdown()
                m.close()
            assert 'marathon_role="agent"' in sdk and "temporal_request" in sdk, sdk[:1500]
            assert 'marathon_rejections_total{{stage="rules"}} 1.0' in app, app[:1500]
            print("wired ok")

        asyncio.run(main())
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "wired ok" in res.stdout
