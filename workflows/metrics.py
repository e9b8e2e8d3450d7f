"""Prometheus metrics for the workers.

A worker started with MARATHON_METRICS_PORT=P (or an explicit port) serves two Prometheus endpoints:

* ``http://HOST:P/metrics``: the Temporal SDK's own metrics (``temporal_*``: task slots, poll and
  schedule-to-start latencies, activity and workflow-task execution latencies and failures, sticky
  cache, request counts). The SDK's Rust core serves them; :func:`temporal_runtime` builds the
  ``temporalio.runtime.Runtime`` that does so, and every client/worker created on that runtime reports there.
* ``http://HOST:P+1/metrics``: the project's counters below, plus the Python process metrics
  (CPU, memory, open files, GC) that ``prometheus_client`` collects by default. Needs the
  ``prometheus-client`` package; without it the counting functions do nothing and no second port is opened.

Counters (cumulative per worker process; aggregate across workers with ``sum``):

* ``marathon_evaluations_total{outcome}``: candidates that finished an evaluation step on this worker,
  by outcome (``passed``, ``rejected``; ``improved`` where the caller knows it).
* ``marathon_rejections_total{stage}``: rejected candidates by the stage that rejected them
  (``rules``, ``compile``, ``verify``, ``benchmark``, ``sandbox``, ...).
* ``marathon_gpu_busy_seconds_total``: seconds the worker had device work under way (a turn of its device
  owner held: an untimed job, such as an upload, a verification call or a comparison, or a timing block).
  An upper bound of the GPU's busy fraction: a turn covers the child's round trip around its device calls,
  so it can read higher than nvidia-smi's utilization, which gives the device's own figure.
* ``marathon_gpu_timed_seconds_total``: of that, timing blocks (timing, profiling): the GPU time that
  cannot overlap anything. The run's ``gpu_seconds`` budget is charged from the benchmark reports instead.
* ``marathon_gpu_closed_seconds_total``: seconds new untimed jobs had to wait for timing: a timing block
  waiting for the running jobs to end, or under way. Jobs that ask then wait (``gpu-job-wait`` in the
  phase log), so this is what timing costs the rest of the pipeline.

Every label value is one of the ``Outcome`` / ``Stage`` literals of workflows/contracts/base.py, and all of
them exist from the start at 0, so ``rate()`` works before the first event.

MARATHON_METRICS_HOST (default ``0.0.0.0``) picks the listening address of both endpoints.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, get_args

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.contracts import Outcome, Stage

try:  # optional: the project's own counters
    import prometheus_client
except ImportError:  # pragma: no cover - exercised only where the package is missing
    prometheus_client = None

PORT_ENV = "MARATHON_METRICS_PORT"
HOST_ENV = "MARATHON_METRICS_HOST"
DEFAULT_HOST = "0.0.0.0"

OUTCOMES: tuple[str, ...] = get_args(Outcome)
STAGES: tuple[str, ...] = get_args(Stage)

log = logging.getLogger(__name__)


class MetricsConfigError(ValueError):
    """A metrics port or address that cannot be used (bad value, or the port is taken)."""


# ---- configuration --------------------------------------------------------------------------------
def metrics_port(value: int | str | None = None) -> int | None:
    """The Temporal metrics port: ``value`` if given, else MARATHON_METRICS_PORT; None when neither is set.

    The project's counters use the next port, so the largest usable value is 65534."""
    raw = value if value is not None else os.environ.get(PORT_ENV)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        port = int(raw)
    except (TypeError, ValueError):
        raise MetricsConfigError(f"{PORT_ENV} must be a port number, got {raw!r}") from None
    if not 1 <= port <= 65534:
        raise MetricsConfigError(f"{PORT_ENV} must be between 1 and 65534 (the next port serves the "
                                 f"project's counters), got {port}")
    return port


def metrics_host(value: str | None = None) -> str:
    return value or os.environ.get(HOST_ENV) or DEFAULT_HOST


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---- Temporal SDK metrics -------------------------------------------------------------------------
def temporal_runtime(metrics_port: int | None, host: str | None = None,
                     global_tags: dict[str, str] | None = None) -> Runtime:
    """A Temporal Runtime that serves the SDK's metrics in Prometheus format on ``host:metrics_port``.

    With ``metrics_port=None`` this is ``Runtime.default()`` (no metrics endpoint). Pass the result to
    ``Client.connect(..., runtime=...)`` or install it with ``Runtime.set_default`` before the first
    client connects; workers inherit the runtime of their client. ``global_tags`` become labels on
    every Temporal metric (e.g. ``{"marathon_role": "gpu"}``). Raises MetricsConfigError when the
    port is taken or the address is invalid."""
    if metrics_port is None:
        return Runtime.default()
    bind = _bind(metrics_host(host), metrics_port)
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind),
                                                 global_tags=dict(global_tags or {})))
    except ValueError as e:  # "Failed starting Prometheus exporter: Address already in use" and the like
        raise MetricsConfigError(f"cannot serve Temporal metrics on {bind}: {e}") from e


# ---- the project's counters -----------------------------------------------------------------------
if prometheus_client is not None:
    _EVALUATIONS = prometheus_client.Counter(
        "marathon_evaluations", "Candidates that finished an evaluation step on this worker, by outcome",
        ["outcome"])
    _REJECTIONS = prometheus_client.Counter(
        "marathon_rejections", "Rejected candidates by the stage that rejected them", ["stage"])
    _GPU_BUSY = prometheus_client.Counter(
        "marathon_gpu_busy_seconds", "Seconds this worker had device work under way (a device turn held: a job or a timing block)")
    _GPU_TIMED = prometheus_client.Counter(
        "marathon_gpu_timed_seconds", "Seconds this worker held timing blocks (timing, profiling)")
    _GPU_CLOSED = prometheus_client.Counter(
        "marathon_gpu_closed_seconds", "Seconds new untimed jobs of this worker waited for timing (a timing "
        "block waiting or under way)")
    for _o in OUTCOMES:
        _EVALUATIONS.labels(outcome=_o)
    for _s in STAGES:
        _REJECTIONS.labels(stage=_s)
else:  # pragma: no cover
    _EVALUATIONS = _REJECTIONS = _GPU_BUSY = _GPU_TIMED = _GPU_CLOSED = None


def counters_available() -> bool:
    """True when prometheus_client is installed, i.e. the project's counters are recorded."""
    return prometheus_client is not None


def count_evaluation(outcome: str, stage: str | None = None) -> None:
    """Count one evaluated candidate. ``outcome`` is an Outcome literal (passed, improved, rejected);
    for ``rejected``, ``stage`` (a Stage literal) names the stage that rejected it and is required.
    Thread-safe; raises ValueError on values outside the literals (they would be label typos)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
    if outcome == "rejected" and stage not in STAGES:
        raise ValueError(f"a rejection needs its stage, one of {', '.join(STAGES)}; got {stage!r}")
    if _EVALUATIONS is None:
        return
    _EVALUATIONS.labels(outcome=outcome).inc()
    if outcome == "rejected":
        _REJECTIONS.labels(stage=stage).inc()


def add_gpu_busy(seconds: float) -> None:
    """Add GPU-busy seconds (non-negative; 0 and None are ignored). Thread-safe."""
    if not seconds:
        return
    if seconds < 0:
        raise ValueError(f"GPU busy time cannot be negative: {seconds}")
    if _GPU_BUSY is not None:
        _GPU_BUSY.inc(seconds)


def add_gpu_timed(seconds: float) -> None:
    """Add seconds of timing blocks (nothing else on the device); 0 and None are ignored. Thread-safe."""
    if seconds and seconds > 0 and _GPU_TIMED is not None:
        _GPU_TIMED.inc(seconds)


def add_gpu_closed(seconds: float) -> None:
    """Add seconds new untimed device jobs waited for timing; 0 and None are ignored. Thread-safe."""
    if seconds and seconds > 0 and _GPU_CLOSED is not None:
        _GPU_CLOSED.inc(seconds)


def observe_report(stage: str, report: Any) -> None:
    """Count a GPU-worker report: a rejection at the stage the report names (``report.stage``, else
    ``stage``), a pass when a benchmark succeeded. (GPU busy time is added by the device owner
    itself, which also sees verification and profiling, not only timed benchmarks.)

    ``stage`` is the activity's step: compile, verify or benchmark. Compile and verify passes are not
    counted as evaluations: the candidate has not finished yet."""
    if not getattr(report, "ok", False):
        count_evaluation("rejected", getattr(report, "stage", None) or stage)
    elif stage == "benchmark":
        count_evaluation("passed")


def start_counters_server(port: int, host: str | None = None):
    """Serve the project's counters (and process metrics) on ``host:port``; returns the HTTP server
    (``.shutdown()`` stops it), or None when prometheus_client is missing."""
    if prometheus_client is None:
        return None
    try:
        res = prometheus_client.start_http_server(port, addr=metrics_host(host))
    except OSError as e:
        raise MetricsConfigError(f"cannot serve the project's counters on {_bind(metrics_host(host), port)}: "
                                 f"{e.strerror or e}") from e
    return res[0] if isinstance(res, tuple) else res


# ---- one call for a worker ------------------------------------------------------------------------
@dataclass
class WorkerMetrics:
    runtime: Runtime
    temporal_port: int | None = None
    counters_port: int | None = None
    server: Any = None  # the prometheus_client HTTP server, if any

    def describe(self) -> str:
        if self.temporal_port is None:
            return f"metrics off (set {PORT_ENV} to serve Prometheus metrics)"
        text = f"Prometheus metrics: Temporal SDK on :{self.temporal_port}/metrics"
        if self.counters_port is not None:
            return text + f", marathon counters on :{self.counters_port}/metrics"
        return text + " (marathon counters off: prometheus-client is not installed)"

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def setup_metrics(port: int | str | None = None, host: str | None = None, role: str | None = None,
                  install_default: bool = True) -> WorkerMetrics:
    """For a worker process, before its client connects: the Temporal runtime on ``port`` (default
    MARATHON_METRICS_PORT) and the project's counters on ``port + 1``.

    With ``install_default`` the runtime becomes ``Runtime.default()``, so ``Client.connect`` without a
    ``runtime`` argument (workflows/client.py ``connect``) reports to it; this must happen before any
    client exists in the process. ``role`` is added as the ``marathon_role`` label on Temporal metrics.
    Without a port nothing is started and the default runtime is returned."""
    p = metrics_port(port)
    if p is None:
        return WorkerMetrics(runtime=Runtime.default())
    rt = temporal_runtime(p, host, {"marathon_role": role} if role else None)
    if install_default:
        Runtime.set_default(rt, error_if_already_set=True)
    server = start_counters_server(p + 1, host)
    if server is None:
        log.warning("prometheus-client is not installed: only the Temporal SDK metrics are served on %s", p)
    return WorkerMetrics(runtime=rt, temporal_port=p, counters_port=p + 1 if server is not None else None,
                         server=server)
