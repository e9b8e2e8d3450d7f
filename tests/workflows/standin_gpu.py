"""A stand-in GPU worker for routing and throughput tests: the real activity names and contracts, and a model
of one GPU worker's costs instead of kernels. Compiling sleeps outside any lock (host CPU); verifying and
benchmarking sleep under this worker's device lock (one GPU: its device time adds up, another worker's does
not). A stage that finds its candidate not loaded on this worker loads and compiles it again, as the harness
does, and counts it. Verdicts and figures are tests.evaluators' synthetic ones."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from tests import evaluators
from workflows.contracts import BenchRequest, CompileReport, EvalRequest, GPU_QUEUE, VerifyReport

#: (stage, candidate id, worker name, random_shape or fresh_process) of every stage any stand-in ran
STAGES: list[tuple[str, str, str, bool]] = []
COMPILES: collections.Counter = collections.Counter()  # candidate id -> compiles on any stand-in
#: (worker name, start, end) of every hold of a stand-in's device, time.monotonic()
DEVICE_SPANS: list[tuple[str, float, float]] = []


def _pause(seconds: float) -> None:
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return
        activity.heartbeat()
        time.sleep(min(0.1, left))


class StandInGpu:
    def __init__(self, name: str, queue: str = GPU_QUEUE, compile_s: float = 0.3, verify_s: float = 0.25,
                 bench_s: float = 0.35, sticky: bool = True):
        self.name, self.queue = name, queue
        self.own = f"{queue}-{name}-{uuid.uuid4().hex[:8]}"
        self.compile_s, self.verify_s, self.bench_s = compile_s, verify_s, bench_s
        self.sticky = sticky  # False: compile reports name no queue of its own (the stages land anywhere)
        self.device = threading.Lock()
        self.loaded: set[str] = set()
        self.on_compile = None  # called with the request after each compile (a test may stop the worker)
        self.on_verify = None  # ... and as each verification starts

    @contextlib.contextmanager
    def _on_device(self):
        while not self.device.acquire(timeout=0.1):
            activity.heartbeat()
        start = time.monotonic()
        try:
            yield
        finally:
            DEVICE_SPANS.append((self.name, start, time.monotonic()))
            self.device.release()

    def _compile(self, cid: str) -> None:
        _pause(self.compile_s)
        COMPILES[cid] += 1
        self.loaded.add(cid)

    def activities(self) -> list:
        @activity.defn(name="compile_candidate")
        def compile_candidate(req: EvalRequest) -> CompileReport:
            STAGES.append(("compile", req.candidate_id, self.name, False))
            self._compile(req.candidate_id)
            if self.on_compile:
                self.on_compile(req)
            return CompileReport(ok=True, interpreter=True, worker_queue=self.own if self.sticky else None)

        @activity.defn(name="verify_candidate")
        def verify_candidate(req: EvalRequest) -> VerifyReport:
            STAGES.append(("verify", req.candidate_id, self.name, req.random_shape))
            if self.on_verify:
                self.on_verify(req)
            if req.candidate_id not in self.loaded:
                self._compile(req.candidate_id)
            with self._on_device():
                _pause(self.verify_s)
            return evaluators.verify_candidate(req)

        @activity.defn(name="benchmark_candidate")
        def benchmark_candidate(req: BenchRequest):
            STAGES.append(("benchmark", req.candidate_id, self.name, req.fresh_process))
            if req.candidate_id not in self.loaded:
                self._compile(req.candidate_id)
            with self._on_device():
                _pause(self.bench_s)
            return evaluators.benchmark_candidate(req)

        return [compile_candidate, verify_candidate, benchmark_candidate, evaluators.profile_candidate]

    async def workers(self, client, shared_slots: int = 2, own_slots: int = 4) -> list[Worker]:
        """Its Worker on the shared queue and, when sticky, the one on its own queue, on a client of its own
        (one client serves one worker per queue), as a separate worker process would."""
        client = await Client.connect(client.service_client.config.target_host, namespace=client.namespace,
                                      data_converter=client.data_converter, identity=f"standin-{self.name}")
        acts = self.activities()
        out = [Worker(client, task_queue=self.queue, activities=acts, activity_executor=ThreadPoolExecutor(4),
                      max_concurrent_activities=shared_slots)]
        if self.sticky:
            out.append(Worker(client, task_queue=self.own, activities=acts,
                              activity_executor=ThreadPoolExecutor(own_slots + 1),
                              max_concurrent_activities=own_slots))
        return out


def reset() -> None:
    STAGES.clear()
    COMPILES.clear()
    DEVICE_SPANS.clear()


def both_busy_s(a: str, b: str) -> float:
    """Seconds during which the devices of stand-ins a and b were both held."""
    spans = {n: [(s, e) for w, s, e in DEVICE_SPANS if w == n] for n in (a, b)}
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in spans[a] for s2, e2 in spans[b])
